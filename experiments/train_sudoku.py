"""Train the Sudoku masked-diffusion denoiser that dlmsearch ships as its default model.

Objective: mask each cell with probability t ~ U(0, 1) (at least one cell), cross-entropy on
the masked cells. Checkpoints periodically (weights, optimiser, step, RNG) and resumes from
the last checkpoint when started again with the same ``out_dir``.

    python experiments/train_sudoku.py                      # full run, resumable
    python experiments/train_sudoku.py budget_minutes=90    # decay the learning rate over 90 CPU minutes
    python experiments/train_sudoku.py steps=20 out_dir=/tmp/tiny model.n_layers=1
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from dlmsearch.models.denoiser import BidirectionalDenoiser, DenoiserConfig
from dlmsearch.tasks.sudoku import SUDOKU_MASK_ID, SUDOKU_VOCAB, grids_to_tokens
from dlmsearch.tasks.sudoku_files import load_puzzles, tier_path
from dlmsearch.tasks.sudoku_grids import random_solved_grid, transform_grids
from dlmsearch.training import Checkpointer, TrainingLoop, checkpoint_solve_rate


class GridSampler:
    """Endless solved grids: random transformations of solver-made base grids.

    Grids equal to a held-out solution are dropped, so the shipped tiers stay unseen.
    """

    def __init__(self, base_count: int, rng: np.random.Generator, excluded: set[bytes]) -> None:
        self.rng = rng
        self.base = np.stack([random_solved_grid(rng) for _ in range(base_count)])
        self.excluded = excluded

    def sample(self, count: int) -> np.ndarray:
        grids = transform_grids(self.base[self.rng.integers(0, len(self.base), count)], self.rng)
        keep = np.array([g.tobytes() not in self.excluded for g in grids])
        return grids[keep]


def masked_diffusion_loss(
    model: BidirectionalDenoiser, tokens: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Mean cross-entropy on cells masked with a per-grid rate t ~ U(0, 1)."""
    rows, length = tokens.shape
    rate = torch.rand(rows, 1, generator=generator)
    masked = torch.rand(rows, length, generator=generator) < rate
    forced = torch.randint(0, length, (rows,), generator=generator)
    masked[torch.arange(rows), forced] = True  # at least one masked cell per grid
    logits = model(torch.where(masked, SUDOKU_MASK_ID, tokens))
    return torch.nn.functional.cross_entropy(logits[masked], tokens[masked])


@hydra.main(version_base=None, config_path="conf/train", config_name="sudoku")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    held_out = [p for tier in ("easy", "hard") for p in load_puzzles(tier_path(tier))]
    eval_puzzles = load_puzzles(tier_path("easy"))[: cfg.eval_puzzles]
    rng = np.random.default_rng(cfg.seed)
    sampler = GridSampler(cfg.base_grids, rng, {p.solution.tobytes() for p in held_out})
    model = BidirectionalDenoiser(DenoiserConfig(vocab_size=SUDOKU_VOCAB, max_len=81, grid_side=9, **cfg.model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    checkpoints = Checkpointer(out, model, optimizer, generator, rng)

    def batch_loss(done: float) -> tuple[torch.Tensor, dict[str, float]]:
        return masked_diffusion_loss(model, grids_to_tokens(sampler.sample(cfg.batch_size)), generator), {}

    def on_checkpoint(step: int, seconds: float, done: float) -> dict:
        model.save(out / "model")
        model.eval()
        solve = checkpoint_solve_rate(model, eval_puzzles, cfg.eval_decoder)
        tqdm.write(f"checkpoint step {step}: {json.dumps(solve)}")
        return {"eval": solve}

    TrainingLoop(cfg, checkpoints).run(batch_loss, on_checkpoint)


if __name__ == "__main__":
    main()
