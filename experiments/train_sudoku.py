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
import time
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
from dlmsearch.training import Checkpointer, checkpoint_solve_rate, learning_rate, progress


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


def masked_diffusion_loss(model: BidirectionalDenoiser, tokens: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
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
    step, elapsed_before = 0, 0.0
    resumed = checkpoints.resume()
    if resumed is not None:
        step, elapsed_before = resumed["step"], resumed["train_seconds"]
        print(f"resumed from {checkpoints.path} at step {step}")
    started = time.monotonic()
    eval_seconds = 0.0  # checkpoint evaluation does not count as training time

    def train_seconds() -> float:
        return elapsed_before + time.monotonic() - started - eval_seconds

    def save(step: int) -> None:
        nonlocal eval_seconds
        seconds = train_seconds()
        checkpoints.save(step, train_seconds=seconds)
        model.save(out / "model")
        tick = time.monotonic()
        model.eval()
        solve = checkpoint_solve_rate(model, eval_puzzles, cfg.eval_decoder)
        model.train()
        eval_seconds += time.monotonic() - tick
        record = {"step": step, "train_seconds": round(seconds, 1), "eval": solve}
        with (out / "eval.jsonl").open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        tqdm.write(f"checkpoint step {step}: {json.dumps(solve)}")

    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc="train", dynamic_ncols=True)
    with (out / "loss.jsonl").open("a") as log:
        while True:
            done = progress(step, cfg.steps, train_seconds(), cfg.budget_minutes)
            if done >= 1.0:
                break
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, done, cfg.lr, cfg.min_lr, cfg.warmup_steps)
            tokens = grids_to_tokens(sampler.sample(cfg.batch_size))
            loss = masked_diffusion_loss(model, tokens, generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
            log.write(json.dumps({"step": step, "loss": round(loss.item(), 5), "lr": optimizer.param_groups[0]["lr"]}) + "\n")
            log.flush()
            finished = progress(step, cfg.steps, train_seconds(), cfg.budget_minutes) >= 1.0
            out_of_time = cfg.max_minutes is not None and time.monotonic() - started > 60 * cfg.max_minutes
            if step % cfg.checkpoint_every == 0 or finished or out_of_time:
                save(step)
            if out_of_time:
                break
    bar.close()


if __name__ == "__main__":
    main()
