"""Train a uniform-noise Countdown model in DiffusionGemma's checkpoint format, resumable.

The model is transformers' own ``DiffusionGemmaForBlockDiffusion`` (text only; the vision tower
the class always builds is a token one nobody calls) at a tiny size: Gemma-4 layers, sliding-window
and full-attention ones, each with its dense MLP and routed experts, one set of weights run as a
causal **encoder** over the prompt (writing the KV cache) and a bidirectional **decoder** over the
canvas of ``gen_length`` tokens (``canvas_length``), which reads that cache. The tokenizer, chat
template and rows are the LLaDA-format model's (``train_countdown.py``: the task's own prompt
encoding, the worked answer, ``<|eot_id|>``, ``<|endoftext|>`` to the end), its curriculum drawn
in the same order from the same seed.

Objective (DiffusionGemma's ``forward`` takes no labels and returns no loss, so it is written
here): each row draws a noise level ``t ~ U(0, 1)``; every canvas position independently becomes a
uniform random id over the whole vocabulary (as ``generate`` starts and re-noises a canvas) with
probability ``t``; the prompt stays clean and goes through the encoder. The loss is the plain
cross-entropy of the clean answer at **every** canvas position, noised or not, averaged over the
positions. Under uniform noise nothing marks which positions were replaced (a kept token and a
random one look alike), so the model must judge every position, and ``generate`` re-decides the
whole canvas at every step and keeps whichever positions it is surest of: the prediction at a
clean position is used exactly as that at a noised one.

Self-conditioning (Chen et al., "Analog Bits"): a share ``self_conditioning`` (0.5) of the rows,
drawn per row, gets a first decoder pass without self-conditioning (DiffusionGemma's zeros, as at
a canvas's first denoising step) on the same noisy canvas; its logits, detached, are the
``self_conditioning_logits`` of the second pass, whose loss is the one used; the other rows' second
pass gets zeros (``self_conditioning_mask`` False). ``generate`` feeds the previous step's logits
after its temperature (``t_max`` 0.8 falling to ``t_min`` 0.4), a sharper distribution than the
untempered logits trained on here.

Checkpoints (weights, optimiser, step, RNG; ``Checkpointer``) every ``checkpoint_every`` steps,
with the held-out cross-entropy at fixed noise levels and the solve rate of transformers'
``generate`` on ``eval_generate`` held-out problems, decoded from the exported directory; the
same ``out_dir`` resumes. The model directory (``out_dir/model``) is written with
``save_pretrained`` (``DiffusionGemmaForBlockDiffusion.from_pretrained`` loads it, with the decoding
defaults in its ``generation_config.json``), the tokenizer and ``trained_on.json``, at each
checkpoint and when the run ends.

    python experiments/train_countdown_uniform.py                          # resumable
    python experiments/train_countdown_uniform.py max_minutes=30           # stop after 30 minutes, resume later
    python experiments/train_countdown_uniform.py steps=20 out_dir=/tmp/cdu checkpoint_every=10
"""

from __future__ import annotations

from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from train_countdown import (
    EOS_ID,
    EOT_ID,
    SPECIALS,
    VOCAB_SIZE,
    ProblemSampler,
    countdown_task,
    encode_batch,
    held_out_triples,
    write_countdown_tokenizer,
)
from train_countdown_block import held_out_rows
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DynamicCache
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig,
    EntropyBoundSamplerConfig,
)
from transformers.utils import logging as transformers_logging

from dlmsearch.models.trained_on import write_trained_on
from dlmsearch.tasks.base import TaskItem
from dlmsearch.tasks.countdown import CountdownTask
from dlmsearch.training import Checkpointer, TrainingLoop

BOS_ID = SPECIALS["<|startoftext|>"]
STOP_IDS = [EOS_ID, EOT_ID]  # generate ends a row at either and pads after it with <|endoftext|>, as the rows are
TOKEN_VISION = dict(  # the class always builds a vision tower; text-only training never calls it
    model_type="gemma4_vision",
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=8,
    patch_size=2,
    position_embedding_size=4,
    output_proj_dims=8,
)


def build_model(m: DictConfig, canvas_length: int) -> DiffusionGemmaForBlockDiffusion:
    """DiffusionGemma at the configured size, with the Countdown tokenizer's vocabulary and ids
    (``<|endoftext|>`` is both the end and the padding, as in the tokenizer). The encoder is
    causal (``use_bidirectional_attention`` unset, so the sliding window is not halved)."""
    text = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=len(m.layer_types),
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads,
        head_dim=m.head_dim,
        global_head_dim=m.global_head_dim,
        num_global_key_value_heads=m.global_kv_heads,
        sliding_window=m.sliding_window,
        layer_types=list(m.layer_types),
        num_experts=m.num_experts,
        top_k_experts=m.top_k_experts,
        moe_intermediate_size=m.moe_intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        pad_token_id=EOS_ID,
        eos_token_id=STOP_IDS,
        bos_token_id=BOS_ID,
    )
    config = DiffusionGemmaConfig(text_config=text, vision_config=dict(TOKEN_VISION), canvas_length=canvas_length)
    return DiffusionGemmaForBlockDiffusion(config)


def generation_config(g: DictConfig, gen_length: int) -> DiffusionGemmaGenerationConfig:
    """The decoding defaults ``from_pretrained`` gives ``generate`` (DiffusionGemma's own values, one canvas)."""
    return DiffusionGemmaGenerationConfig(
        max_new_tokens=gen_length,
        max_denoising_steps=g.max_denoising_steps,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(g.entropy_bound)),
        t_min=float(g.t_min),
        t_max=float(g.t_max),
        stability_threshold=g.stability_threshold,
        confidence_threshold=float(g.confidence_threshold),
        bos_token_id=BOS_ID,
        eos_token_id=STOP_IDS,
        pad_token_id=EOS_ID,
    )


def uniform_noise(canvas: torch.Tensor, rate: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``canvas`` ``[rows, L]`` with each position replaced, with probability ``rate`` ``[rows, 1]``,
    by a uniform random id over the whole vocabulary (``generate``'s canvas noise)."""
    replaced = torch.rand(canvas.shape, generator=generator) < rate
    return torch.where(replaced, torch.randint(0, VOCAB_SIZE, canvas.shape, generator=generator), canvas)


def encode_prompt(model: DiffusionGemmaForBlockDiffusion, prompt: torch.Tensor, mask: torch.Tensor) -> DynamicCache:
    """The encoder's KV cache of ``prompt`` ``[rows, P]`` (left-padded, ``mask`` its real tokens), as
    ``generate`` builds it: a ``DynamicCache`` of the text config, positions ``0..P-1``."""
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    positions = torch.arange(prompt.shape[1])[None]
    return model.model.encoder(input_ids=prompt, attention_mask=mask, cache=cache, position_ids=positions).cache


def decode(
    model: DiffusionGemmaForBlockDiffusion,
    cache: DynamicCache,
    canvas: torch.Tensor,
    prompt_mask: torch.Tensor,
    self_conditioning: torch.Tensor | None = None,
    conditioned: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decoder's logits ``[rows, L, V]`` for ``canvas`` over the cached prompt, with ``generate``'s
    attention mask and positions (the canvas continues after the prompt)."""
    width, length = prompt_mask.shape[1], canvas.shape[1]
    return model(
        cache=cache,
        decoder_input_ids=canvas,
        decoder_attention_mask=torch.nn.functional.pad(prompt_mask, (0, length), value=True),
        decoder_position_ids=torch.arange(width, width + length)[None],
        self_conditioning_logits=self_conditioning,
        self_conditioning_mask=conditioned,
    ).logits


def uniform_diffusion_loss(
    model: DiffusionGemmaForBlockDiffusion,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    start: int,
    generator: torch.Generator,
    self_conditioning: float,
    rate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """The uniform-noise loss of rows ``tokens`` ``[rows, start + L]`` (prompt, then the clean canvas):
    the cross-entropy of the clean canvas at every position, and that at the noised positions only.
    ``rate`` ``[rows, 1]`` fixes the noise levels (held-out evaluation); ``self_conditioning`` is the
    share of rows given a first pass's detached logits (module docstring)."""
    prompt, mask, clean = tokens[:, :start], attention[:, :start], tokens[:, start:]
    rows = clean.shape[0]
    if rate is None:
        rate = torch.rand(rows, 1, generator=generator)
    noisy = uniform_noise(clean, rate, generator)
    conditioned = torch.rand(rows, generator=generator) < self_conditioning
    cache = encode_prompt(model, prompt, mask)
    first = None
    if conditioned.any():
        with torch.no_grad():
            first = decode(model, cache, noisy, mask)
    logits = decode(model, cache, noisy, mask, first, conditioned if first is not None else None)
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), clean.flatten(), reduction="none").view(rows, -1)
    noised = noisy != clean
    return losses.mean(), losses[noised].mean().item() if noised.any() else 0.0


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch (``<|endoftext|>``) and its attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), EOS_ID, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, True
    return ids, mask


@torch.no_grad()
def generate_solve_rate(model_dir: Path, task: CountdownTask, items: list[TaskItem], seed: int) -> dict:
    """Share of ``items`` that transformers' ``generate`` solves, decoding from the exported directory
    with its own defaults (its ``generation_config.json``), and its mean tokens per decoder forward.
    Its random canvases come from torch's global generator, seeded here and put back after."""
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(model_dir)).eval()
    ids, mask = left_padded([item.prompt for item in items])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        out = model.generate(ids, attention_mask=mask)
    answers = out.sequences[:, ids.shape[1] :]
    correct = [bool(task.judge(item, answer)) for item, answer in zip(items, answers)]
    return {
        "items": len(items),
        "accuracy": round(sum(correct) / len(correct), 4),
        "tokens_per_forward": round(float(out.tokens_per_forward.float().mean()), 3),
    }


def export(model: DiffusionGemmaForBlockDiffusion, model_dir: Path, cfg: DictConfig) -> None:
    """The model directory: ``save_pretrained`` (config, weights, generation defaults) and what it was
    trained for (the tokenizer and PC-Sampler's table come from ``write_countdown_tokenizer``)."""
    model.save_pretrained(str(model_dir))
    write_trained_on(
        model_dir,
        template=cfg.template,
        gen_length=cfg.gen_length,
        block_length=cfg.gen_length,
        tier="small",
        token_frequencies="token_frequencies.json",
    )


@hydra.main(version_base=None, config_path="conf/train", config_name="countdown_uniform")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    transformers_logging.disable_progress_bar()
    out = Path(cfg.out_dir)
    model_dir = out / "model"
    write_countdown_tokenizer(model_dir)
    task = countdown_task(model_dir, cfg, cfg.eval_tier, cfg.gen_length)
    held_out = held_out_rows(cfg.eval_tier, cfg.eval_items)
    generate_items = task.items()[: cfg.eval_generate]
    rng = np.random.default_rng(cfg.seed)
    sampler = ProblemSampler(cfg.curriculum, rng, held_out_triples())
    torch.manual_seed(cfg.seed)  # the initial weights (a resumed run loads its checkpoint's)
    model = build_model(cfg.model, cfg.gen_length)
    model.generation_config = generation_config(cfg.generate, cfg.gen_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    generator = torch.Generator().manual_seed(cfg.seed)
    checkpoints = Checkpointer(out, model, optimizer, generator, rng)
    checkpoints.start_from(
        cfg.init_from, lambda directory: DiffusionGemmaForBlockDiffusion.from_pretrained(str(directory)).state_dict()
    )
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters; config {OmegaConf.to_container(cfg.model)}")

    def held_out_ce() -> dict[str, float]:
        """The cross-entropy (every canvas position) of the held-out rows at noise levels 0.1, 0.3,
        ..., 0.9 (fixed draws), without self-conditioning (a canvas's first denoising step)."""
        model.eval()
        tokens, attention, start = encode_batch(task, held_out, cfg.gen_length)
        values = {}
        with torch.no_grad():
            for t in (0.1, 0.3, 0.5, 0.7, 0.9):
                loss, _ = uniform_diffusion_loss(
                    model,
                    tokens,
                    attention,
                    start,
                    torch.Generator().manual_seed(7),
                    0.0,
                    torch.full((len(tokens), 1), t),
                )
                values[f"t{t}"] = round(loss.item(), 5)
        return values

    def batch_loss(done: float) -> tuple[torch.Tensor, dict[str, float]]:
        tokens, attention, start = encode_batch(
            task, [sampler.draw(done) for _ in range(cfg.batch_size)], cfg.gen_length
        )
        loss, noised = uniform_diffusion_loss(model, tokens, attention, start, generator, cfg.self_conditioning)
        return loss, {"noised_ce": noised}

    def on_checkpoint(step: int, seconds: float, done: float) -> dict:
        export(model, model_dir, cfg)
        levels = held_out_ce()
        record = {
            "numbers_up_to": sampler.high(done),
            "held_out_ce": round(float(np.mean(list(levels.values()))), 5),
            "held_out_ce_by_noise": levels,
        }
        if cfg.eval_generate:
            record["generate"] = generate_solve_rate(model_dir, task, generate_items, cfg.seed)
        solved = f", generate solves {record['generate']['accuracy']:.3f}" if cfg.eval_generate else ""
        tqdm.write(f"checkpoint step {step}: held-out CE {record['held_out_ce']:.4f}{solved}")
        return record

    TrainingLoop(cfg, checkpoints).run(batch_loss, on_checkpoint)
    export(model, model_dir, cfg)  # the weights reached (a finished run exports them again)


if __name__ == "__main__":
    main()
