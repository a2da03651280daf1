"""The uniform-noise Countdown model's training (``experiments/train_countdown_uniform.py``): the
loss runs DiffusionGemma's encoder and decoder as ``generate`` does, self-conditioning is the
first pass's detached logits on the chosen rows only, and a tiny run checkpoints, exports a
directory that ``DiffusionGemmaForBlockDiffusion.from_pretrained`` loads and ``generate`` decodes,
and, killed and started again, resumes into exactly the run it would have been."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from train_countdown import EOS_ID, VOCAB_SIZE
from train_countdown_uniform import build_model, decode, encode_prompt, uniform_diffusion_loss, uniform_noise
from transformers import DiffusionGemmaForBlockDiffusion

from dlmsearch.training import CHECKPOINT

torch.set_num_threads(1)

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "experiments" / "train_countdown_uniform.py"
STEPS, EVERY = 6, 3
MODEL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "n_heads": 2,
    "n_kv_heads": 1,
    "head_dim": 16,
    "global_head_dim": 16,
    "global_kv_heads": 1,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_experts": 2,
    "top_k_experts": 1,
    "moe_intermediate_size": 16,
    "max_position_embeddings": 64,
}
TINY = [
    f"checkpoint_every={EVERY}",
    "batch_size=8",
    "threads=1",
    "warmup_steps=2",
    "lr=3e-3",
    "eval_items=8",
    "eval_generate=4",
    "generate.max_denoising_steps=3",
    *(f"model.{k}=[{','.join(v)}]" if isinstance(v, list) else f"model.{k}={v}" for k, v in MODEL.items()),
]


class Interrupted(Exception):
    """Stands in for the process being killed."""


@pytest.fixture(autouse=True)
def _keep_torch_rng():
    """The script seeds torch's global generator: the tests after these see it as it was."""
    with torch.random.fork_rng():
        yield


def _tiny() -> DiffusionGemmaForBlockDiffusion:
    torch.manual_seed(0)
    return build_model(OmegaConf.create(MODEL), canvas_length=6)


def _rows(rows: int = 3, prompt: int = 10, canvas: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 1400, (rows, prompt + canvas), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(tokens, dtype=torch.bool)
    attention[1, :3] = False  # a shorter prompt, left-padded
    tokens[1, :3] = EOS_ID
    return tokens, attention


def test_noise_replaces_positions_with_uniform_ids_at_the_rate() -> None:
    canvas = torch.full((4, 400), 7)
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(uniform_noise(canvas, torch.zeros(4, 1), generator), canvas)
    noisy = uniform_noise(canvas, torch.tensor([[0.0], [0.25], [0.75], [1.0]]), generator)
    shares = (noisy != 7).float().mean(dim=1)
    assert shares[0] == 0 and abs(shares[1] - 0.25) < 0.06 and abs(shares[2] - 0.75) < 0.06 and shares[3] > 0.99
    assert int(noisy.max()) < VOCAB_SIZE and int(noisy.max()) > 1400  # the whole vocabulary, specials too


def test_training_forward_is_the_models_own_encoder_decoder_path() -> None:
    """``encode_prompt`` + ``decode`` (what the loss runs) give the logits of the model's own forward
    (encoder over the prompt, then the decoder over the canvas), padding and positions as ``generate``'s."""
    model, (tokens, attention) = _tiny().eval(), _rows()
    prompt, mask, canvas = tokens[:, :10], attention[:, :10], tokens[:, 10:]
    with torch.no_grad():
        ours = decode(model, encode_prompt(model, prompt, mask), canvas, mask)
        own = model(
            input_ids=prompt,
            attention_mask=mask,
            decoder_input_ids=canvas,
            decoder_attention_mask=torch.nn.functional.pad(mask, (0, 6), value=True),
            decoder_position_ids=torch.arange(10, 16)[None],
        ).logits
        logits = torch.randn(3, 6, VOCAB_SIZE)
        cache = encode_prompt(model, prompt, mask)
        unconditioned = decode(model, cache, canvas, mask, logits, torch.tensor([False, False, True]))
        conditioned = decode(model, cache, canvas, mask, logits)
    assert torch.allclose(ours, own, atol=1e-5)
    assert torch.allclose(unconditioned[:2], ours[:2], atol=1e-5), "a row left out of self-conditioning gets zeros"
    assert torch.allclose(unconditioned[2], conditioned[2], atol=1e-5) and not torch.allclose(conditioned, ours)


def test_the_loss_trains_the_shared_weights_and_the_self_conditioning_block() -> None:
    model, (tokens, attention) = _tiny().train(), _rows()
    shared = model.model.encoder.language_model.layers[0].self_attn.q_proj.weight
    assert shared is model.model.decoder.layers[0].self_attn.q_proj.weight, "encoder and decoder share their layers"
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    loss, noised = uniform_diffusion_loss(model, tokens, attention, 10, torch.Generator().manual_seed(2), 1.0)
    loss.backward()
    assert torch.isfinite(loss) and noised > 0
    assert bool(shared.grad.abs().sum() > 0)
    assert bool(model.model.decoder.self_conditioning.gate_proj.weight.grad.abs().sum() > 0)
    model.zero_grad()
    clean, _ = uniform_diffusion_loss(model, tokens, attention, 10, torch.Generator(), 0.0, torch.zeros(3, 1))
    assert clean.item() > 0 and torch.isfinite(clean)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _in_process(out_dir: Path) -> None:
    import train_countdown_uniform
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "experiments" / "conf" / "train"), version_base=None):
        cfg = compose("countdown_uniform", overrides=[f"steps={STEPS}", *TINY, f"out_dir={out_dir}"])
    train_countdown_uniform.main(cfg)


def test_a_tiny_run_exports_a_diffusion_gemma_directory_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = tmp_path / "whole"
    _in_process(whole)
    losses = _records(whole / "loss.jsonl")
    assert [r["step"] for r in losses] == list(range(1, STEPS + 1))
    evals = _records(whole / "eval.jsonl")
    assert [r["step"] for r in evals] == [EVERY, STEPS]
    for record in evals:
        assert record["held_out_ce"] > 0 and set(record["held_out_ce_by_noise"]) == {
            "t0.1",
            "t0.3",
            "t0.5",
            "t0.7",
            "t0.9",
        }
        assert record["generate"]["items"] == 4 and 0.0 <= record["generate"]["accuracy"] <= 1.0
    model_dir = whole / "model"
    assert json.loads((model_dir / "trained_on.json").read_text())["gen_length"] == 16
    assert {"tokenizer.json", "generation_config.json", "config.json"} <= {p.name for p in model_dir.iterdir()}
    loaded = DiffusionGemmaForBlockDiffusion.from_pretrained(str(model_dir)).eval()
    assert loaded.config.canvas_length == 16 and loaded.config.text_config.sliding_window == 8
    state = torch.load(whole / CHECKPOINT, weights_only=False)
    assert state["step"] == STEPS
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state["model"].items()), "export != checkpoint"
    out = loaded.generate(torch.randint(0, 1400, (2, 12)), max_denoising_steps=2)
    assert out.sequences.shape == (2, 12 + 16)

    # The same run killed during step 5 (after the step-3 checkpoint), then the same command again.
    cut = tmp_path / "cut"
    import dlmsearch.training as training_loop

    schedule = training_loop.learning_rate

    def killed_at_5(step: int, *args: float) -> float:
        if step == 4:  # the fifth step (steps count from 0 here)
            raise Interrupted
        return schedule(step, *args)

    with monkeypatch.context() as patched:
        patched.setattr(training_loop, "learning_rate", killed_at_5)
        with pytest.raises(Interrupted):
            _in_process(cut)
    assert [r["step"] for r in _records(cut / "loss.jsonl")] == [1, 2, 3, 4]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    again = subprocess.run(
        [sys.executable, str(SCRIPT), f"steps={STEPS}", *TINY, f"out_dir={cut}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert f"resumed from {cut / CHECKPOINT} at step {EVERY}" in again.stdout + again.stderr
    assert _records(cut / "loss.jsonl") == losses
    drop = ("train_seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in _records(cut / "eval.jsonl")] == [
        {k: v for k, v in r.items() if k not in drop} for r in evals
    ]
