"""Train a block-diffusion Countdown model (SDAR's architecture: Qwen3-style, q/k norm, GQA) with
block-diffusion SFT, resumable.

The rows are the LLaDA-format model's (``train_countdown.py``: the task's own prompt encoding,
the worked answer, ``<|eot_id|>``, ``<|endoftext|>`` to the end), cut into blocks of
``block_length`` by absolute position from the first prompt token, as SDAR's canvas is. Each
row is forwarded once as ``[clean | noisy]``: the clean copy attends block-causally to itself,
and every noisy block attends to itself (bidirectionally) and to the clean blocks before it,
so that one forward trains every block against exactly the context decoding gives it (the
finished blocks, clean). Each block of the response draws its own mask rate ``t ~ U(0, 1)``;
the loss is the masked tokens' cross-entropy weighted by ``1/t``, over the response length.
Prompt tokens are never masked. Checkpoints (weights, optimiser, step, RNG; ``Checkpointer``)
every ``checkpoint_every`` steps, with the held-out masked cross-entropy; the same ``out_dir``
resumes; the model directory (``out_dir/model``) is an SDAR checkpoint (``save_sdar``), written at
each checkpoint and when the run ends (running a finished run again only writes it).

    python experiments/train_countdown_block.py                          # resumable
    python experiments/train_countdown_block.py max_minutes=30           # stop after 30 minutes, resume later
    python experiments/train_countdown_block.py steps=20 out_dir=/tmp/cdb model.n_layers=1 checkpoint_every=10

``attention=full`` is the ablation: the same architecture, rows, blocks and per-block mask rates, with
full attention over the row; its directory is still an SDAR checkpoint (blocks of ``block_length``
for the decoding schedule), decoded with ``model.full_attention=true``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig
from tqdm import tqdm
from train_countdown import (
    EOS_ID,
    EOT_ID,
    MASK_ID,
    VOCAB_SIZE,
    ProblemSampler,
    countdown_task,
    encode_batch,
    held_out_triples,
    native_weights,
    write_countdown_tokenizer,
)

from dlmsearch.core import attention as pattern
from dlmsearch.models.sdar_checkpoint import save_sdar
from dlmsearch.models.trained_on import write_trained_on
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.tasks.countdown import load_countdown, shipped_countdown_path
from dlmsearch.tasks.countdown_problems import CountdownProblem, solutions
from dlmsearch.training import Checkpointer, TrainingLoop


def block_ids(attention: torch.Tensor, block_length: int) -> torch.Tensor:
    """``[rows, width]`` each real token's block (its absolute position from the first prompt token
    over ``block_length``, SDAR's canvas), ``-1`` on padding."""
    return torch.where(attention, pattern.positions(attention) // block_length, -1)


def clean_noisy_layout(
    attention: torch.Tensor, block_length: int, noisy_from: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[rows, W + N, W + N]`` attention (query may attend to key) and ``[rows, W + N]``
    positions of a ``[clean | noisy]`` row whose noisy copy holds columns ``noisy_from:`` only
    (``N = W - noisy_from``): clean attends to clean blocks up to its own, noisy to its own noisy
    block and the clean blocks before it; padding is never attended (a padded query sees itself
    only). Columns before ``noisy_from`` are never masked, and a noisy copy of a block wholly
    before it would serve no loss, so leaving it out only saves work."""
    blocks = block_ids(attention, block_length)
    real = attention[:, None, :]
    query, key = blocks[:, :, None], blocks[:, None, :]
    clean_clean = real & (key <= query)
    noisy_query = query[:, noisy_from:]
    noisy_noisy = real[:, :, noisy_from:] & (key[:, :, noisy_from:] == noisy_query)
    noisy_clean = real & (key < noisy_query)
    nothing = torch.zeros(clean_clean.shape[0], clean_clean.shape[1], noisy_noisy.shape[2], dtype=torch.bool)
    layout = torch.cat([torch.cat([clean_clean, nothing], dim=2), torch.cat([noisy_clean, noisy_noisy], dim=2)], dim=1)
    layout = layout | torch.eye(layout.shape[1], dtype=torch.bool)[None]
    positions = pattern.positions(attention)
    return layout, torch.cat([positions, positions[:, noisy_from:]], dim=1)


def block_sft_loss(
    model: BidirectionalTransformer,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    start: int,
    block_length: int,
    generator: torch.Generator,
    rate: torch.Tensor | None = None,
    mask_id: int = MASK_ID,
    full_attention: bool = False,
) -> tuple[torch.Tensor, float]:
    """Block-diffusion SFT on the response columns ``start:``: the ``1/t``-weighted loss and the plain
    masked-token cross-entropy. ``rate`` ``[rows, width]`` fixes the mask rates (held-out evaluation).
    ``full_attention`` (the ablation): the same blocks and per-block mask rates, but one forward of the
    noisy row in which every token attends to every other, as a masked-diffusion model is decoded."""
    rows, width = tokens.shape
    eps = 1e-3
    blocks = block_ids(attention, block_length)
    if rate is None:
        per_block = (1 - eps) * torch.rand(rows, int(blocks.max()) + 1, generator=generator) + eps
        rate = per_block.gather(1, blocks.clamp(min=0))
    masked = (torch.rand(rows, width, generator=generator) < rate) & (torch.arange(width) >= start)[None, :]
    noisy = torch.where(masked, mask_id, tokens)
    if full_attention:  # the ablation: the noisy row alone, every real token seeing every other
        layout = attention[:, None, :] | torch.eye(width, dtype=torch.bool)[None]
        logits, _ = model.run(noisy, None, start, attention=layout, positions=pattern.positions(attention))
    else:
        noisy_from = max(0, start - block_length + 1)  # the earliest column of a block that holds a response token
        layout, positions = clean_noisy_layout(attention, block_length, noisy_from)
        logits, _ = model.run(
            torch.cat([tokens, noisy[:, noisy_from:]], dim=1),
            None,
            width + start - noisy_from,
            attention=layout,
            positions=positions,
        )
    chosen = masked[:, start:]
    losses = torch.nn.functional.cross_entropy(logits[chosen], tokens[:, start:][chosen], reduction="none")
    weights = (1.0 / rate[:, start:])[chosen]
    return (losses * weights).sum() / (rows * (width - start)), losses.mean().item() if chosen.any() else 0.0


def held_out_rows(tier: str, count: int) -> list[tuple[CountdownProblem, str]]:
    """The first ``count`` problems of a shipped tier (never trained on), each with its first worked answer."""
    problems = [problem for _, problem in load_countdown(shipped_countdown_path(tier))][:count]
    return [(problem, solutions(tuple(problem.numbers))[problem.target][0]) for problem in problems]


def build_model(m: DictConfig, block_length: int) -> BidirectionalTransformer:
    """SDAR's architecture at the configured size: q/k norm, grouped-query attention, untied head,
    block-causal attention over ``block_length`` (training passes its own ``[clean | noisy]`` layout)."""
    return BidirectionalTransformer(
        TransformerConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=m.d_model,
            num_layers=m.n_layers,
            num_heads=m.n_heads,
            num_kv_heads=m.n_kv_heads,
            intermediate_size=m.mlp_hidden_size,
            max_length=m.max_sequence_length,
            rope_theta=m.rope_theta,
            rms_norm_eps=1e-6,
            qk_norm=True,
            tie_embeddings=False,
            block_size=block_length,
        )
    )


@hydra.main(version_base=None, config_path="conf/train", config_name="countdown_block")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    model_dir = out / "model"
    write_countdown_tokenizer(model_dir)
    task = countdown_task(model_dir, cfg, cfg.eval_tier, cfg.block_length)
    held_out = held_out_rows(cfg.eval_tier, cfg.eval_items)
    rng = np.random.default_rng(cfg.seed)
    sampler = ProblemSampler(cfg.curriculum, rng, held_out_triples())
    model = build_model(cfg.model, cfg.block_length)
    if cfg.attention not in ("block", "full"):
        raise ValueError(f"attention={cfg.attention!r}: block (SDAR's block-causal attention) or full (the ablation)")
    full = cfg.attention == "full"
    for name, parameter in model.named_parameters():
        if parameter.dim() == 2:
            torch.nn.init.normal_(parameter, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    generator = torch.Generator().manual_seed(cfg.seed)
    checkpoints = Checkpointer(out, model, optimizer, generator, rng)
    checkpoints.start_from(cfg.init_from, lambda directory: native_weights(directory, "sdar"))

    def held_out_ce() -> float:
        """The masked cross-entropy of the held-out rows at mask rates 0.1, 0.3, ..., 0.9 (fixed draws)."""
        model.eval()
        tokens, attention, start = encode_batch(task, held_out, cfg.gen_length)
        with torch.no_grad():
            values = [
                block_sft_loss(
                    model,
                    tokens,
                    attention,
                    start,
                    cfg.block_length,
                    torch.Generator().manual_seed(7),
                    torch.full(tokens.shape, r),
                    full_attention=full,
                )[1]
                for r in (0.1, 0.3, 0.5, 0.7, 0.9)
            ]
        return float(np.mean(values))

    def batch_loss(done: float) -> tuple[torch.Tensor, dict[str, float]]:
        tokens, attention, start = encode_batch(
            task, [sampler.draw(done) for _ in range(cfg.batch_size)], cfg.gen_length
        )
        loss, plain = block_sft_loss(model, tokens, attention, start, cfg.block_length, generator, full_attention=full)
        return loss, {"masked_ce": plain}

    def on_checkpoint(step: int, seconds: float, done: float) -> dict:
        save_sdar(model_dir, model, mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
        write_trained_on(
            model_dir,
            template=cfg.template,
            gen_length=cfg.gen_length,
            block_length=cfg.block_length,
            tier="small",
            token_frequencies="token_frequencies.json",
        )
        record = {"numbers_up_to": sampler.high(done), "held_out_masked_ce": round(held_out_ce(), 5)}
        tqdm.write(f"checkpoint step {step}: held-out masked CE {record['held_out_masked_ce']:.4f}")
        return record

    TrainingLoop(cfg, checkpoints).run(batch_loss, on_checkpoint)
    save_sdar(
        model_dir, model, mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID
    )  # the weights reached (a finished run exports them again)


if __name__ == "__main__":
    main()
