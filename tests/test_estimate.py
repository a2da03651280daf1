"""``python -m dlmsearch.estimate``: parameter counts against built models, the per-rank arithmetic,
the tables and the one-line errors."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlmsearch.estimate import (
    PRESETS,
    EstimateError,
    architecture,
    memory_table,
    native_config,
    preset,
    rank_memory,
)
from dlmsearch.estimate.__main__ import main
from dlmsearch.estimate.table import GIB, fits
from dlmsearch.models.transformer import BidirectionalTransformer

# tiny config.json dicts in each family's own keys
LLADA = {
    "model_type": "llada",
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "mlp_hidden_size": 48,
    "embedding_size": 64,
    "vocab_size": 64,
    "weight_tying": False,
}
DREAM = {
    "model_type": "Dream",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
}
SDAR = {**DREAM, "model_type": "sdar", "head_dim": 16, "tie_word_embeddings": True}
LLADA2 = {
    "model_type": "llada2_moe",
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_experts": 8,
    "num_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "vocab_size": 64,
}
NATIVE = {
    "llada": LLADA,
    "llada_tied": {**LLADA, "weight_tying": True},
    "llada_multi_query": {**LLADA, "multi_query_attention": True, "mlp_hidden_size": None, "mlp_ratio": 2},
    "dream": DREAM,
    "sdar": SDAR,
    "llada2": LLADA2,
    "llada2_every_layer_moe": {**LLADA2, "intermediate_size": None, "first_k_dense_replace": 0},
    "llada2_no_shared_expert": {**LLADA2, "num_shared_experts": 0},
    "ling_bailing_moe": {**LLADA2, "model_type": "bailing_moe"},
}

TINY_GEMMA = {
    "model_type": "diffusion_gemma",
    "canvas_length": 8,
    "boi_token_id": 93,
    "eoi_token_id": 94,
    "image_token_id": 95,
    "text_config": {
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "global_head_dim": 16,
        "num_global_key_value_heads": 1,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "sliding_window": 6,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 16,
        "max_position_embeddings": 512,
    },
    "vision_config": {
        "model_type": "gemma4_vision",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "position_embedding_size": 16,
    },
}


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # tied parameters once


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # a layer without shared experts
@pytest.mark.parametrize("name", sorted(NATIVE))
def test_native_count_is_the_built_transformers(name: str) -> None:
    config = NATIVE[name]
    model = BidirectionalTransformer(native_config(config))
    assert architecture(config, name).total == _numel(model)


@pytest.mark.parametrize("name", [n for n, (_, c) in PRESETS.items() if c["model_type"] != "diffusion_gemma"])
def test_native_preset_count_is_the_built_transformers(name: str) -> None:
    with torch.device("meta"):  # full size, no memory
        model = BidirectionalTransformer(native_config(PRESETS[name][1]))
    assert preset(name).total == _numel(model)


def test_llada2_flash_is_ling_flash_2_sized() -> None:
    # the Hugging Face API's safetensors count of inclusionAI/Ling-flash-2.0, less its 7936 float32
    # expert_bias entries (31 MoE layers x 256: buffers here, not parameters)
    assert preset("llada2-flash").total == 102_889_705_216 - 7936


def _gemma(config: dict):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    return DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(config))


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_diffusion_gemma_count_is_the_built_model(tie: bool, bias: bool) -> None:
    config = {**TINY_GEMMA, "tie_word_embeddings": tie}
    config["text_config"] = {**TINY_GEMMA["text_config"], "attention_bias": bias}
    model = _gemma(config)
    arch = architecture(config, "tiny")
    assert arch.total == _numel(model)
    vision = sum(p.numel() for n, p in model.named_parameters() if "vision_tower" in n or "embed_vision" in n)
    assert vision > 0 and f"vision tower ({vision / 1e9:.2f}B)" in arch.replicated_parts


def test_diffusion_gemma_preset_count_is_the_built_model() -> None:
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(PRESETS["diffusion-gemma-26b-a4b"][1]))
    assert preset("diffusion-gemma-26b-a4b").total == _numel(model) == 25_823_778_864


@pytest.mark.parametrize("name", ["llada-8b", "llada2-flash", "llada2-mini", "dream-7b"])
def test_split_parts_add_up_to_the_model(name: str) -> None:
    """Where N divides every head count, N ranks hold the split weights once and the replicated N times."""
    arch = preset(name)
    for n in (1, 2, 4):
        row = rank_memory(arch, n, "bfloat16", 1, 16)
        assert abs(n * (row.weights - row.replicated) + row.replicated - 2 * arch.total) <= n
        assert row.replicated == 2 * arch.replicated and not row.notes


def test_kv_cache_formula() -> None:
    arch = preset("llada-8b")  # 32 layers, 32 kv heads of 128
    assert rank_memory(arch, 4, "bfloat16", 2, 100).kv_cache == 32 * 2 * 2 * 100 * 8 * 128 * 2
    assert rank_memory(arch, 4, "float32", 2, 100).kv_cache == 32 * 2 * 2 * 100 * 8 * 128 * 4
    assert rank_memory(arch, 4, "bfloat16", 2, 100, cache="none").kv_cache == 0
    assert rank_memory(arch, 1, "float32", 1, 1).weights == 4 * arch.total


def test_diffusion_gemma_cache_keeps_a_window_on_sliding_layers() -> None:
    arch = architecture(TINY_GEMMA, "tiny")  # sliding: 2 kv heads of 8, window 6; full: 1 kv head of 16
    assert rank_memory(arch, 1, "float32", 3, 4).kv_cache == (2 * 2 * 3 * 4 * 2 * 8 + 2 * 3 * 4 * 1 * 16) * 4
    assert rank_memory(arch, 1, "float32", 3, 50).kv_cache == (2 * 2 * 3 * 5 * 2 * 8 + 2 * 3 * 50 * 1 * 16) * 4


def test_fewer_kv_heads_than_ranks_holds_one_head_each() -> None:
    arch = preset("diffusion-gemma-26b-a4b")  # full layers: 2 kv heads of 512
    row4, row8 = (rank_memory(arch, n, "bfloat16", 1, 4096) for n in (4, 8))
    assert any("2 key/value heads hold one whole head per rank (4 ranks share each" in note for note in row8.notes)
    full_layer = 2 * 1 * 4096 * 1 * 512 * 2  # one head each at N=4 and N=8
    sliding_4, sliding_8 = (2 * 1023 * (8 // n) * 256 * 2 for n in (4, 8))
    assert row4.kv_cache - row8.kv_cache == 25 * (sliding_4 - sliding_8) + 5 * (full_layer - full_layer)


def test_fits_uses_decimal_capacities() -> None:
    assert fits(80 * 10**9) == "yes / yes"
    assert fits(80 * 10**9 + 1) == "no / yes"
    assert fits(141 * 10**9 + 1) == "no / no"


def test_table_has_a_row_per_degree() -> None:
    table = memory_table(preset("llada2-mini"), [1, 2, 4, 8], "bfloat16", 8, 2048)
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "2", "4", "8"]
    assert "16.26B parameters, 256 routed experts" in table
    assert "fits 80 GB / 141 GB?" in table


def test_cli_prints_presets(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--preset", "llada2-flash", "diffusion-gemma-26b-a4b", "--batch", "8", "--length", "2048"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "### llada2-flash" in out and "### diffusion-gemma-26b-a4b" in out
    assert "| 4 | 49.76 | 2.46 | 0.25 | 50.01 | yes / yes |" in out


def test_cli_reads_a_config_file_or_its_directory(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLADA2))
    for path in (tmp_path, tmp_path / "config.json"):
        assert main(["--config", str(path), "--tp", "1", "2"]) == 0
        out = capsys.readouterr().out
        expected = architecture(LLADA2, "x").total * 2 / GIB
        assert f"| 1 | {expected:.2f} |" in out


def _bad_llada2(tmp_path) -> str:
    path = tmp_path / "experts.json"
    path.write_text(json.dumps({**LLADA2, "num_experts": 6}))  # 4 heads, 2 kv heads, 6 experts
    return str(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "llada-9b"], "error: unknown preset 'llada-9b'; known presets: llada2-flash"),
        (["--config", "/no/such/config.json"], "error: --config /no/such/config.json: no such file"),
        (["--preset", "dream-7b", "--tp", "8"], "error: dream-7b: N=8 does not divide num_attention_heads=28"),
        (["--preset", "dream-7b", "--tp", "7"], "N=7 does not divide num_key_value_heads=4 (nor is it a multiple"),
        (["--preset", "llada-8b", "--tp", "0"], "the parallel degree must be at least 1"),
        (["--preset", "llada-8b", "--batch", "0"], "both must be at least 1"),
        ("experts", "experts.json: N=4 does not divide num_experts=6"),
    ],
)
def test_errors_are_one_line(args, message: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    if args == "experts":
        args = ["--config", _bad_llada2(tmp_path), "--tp", "4"]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err


def test_kv_heads_neither_dividing_nor_divided() -> None:
    arch = architecture({**DREAM, "num_attention_heads": 12, "num_key_value_heads": 4}, "gqa")
    with pytest.raises(EstimateError, match=r"gqa: N=6 does not divide num_key_value_heads=4"):
        rank_memory(arch, 6, "bfloat16", 1, 8)


def test_unsupported_config_is_one_line() -> None:
    with pytest.raises(EstimateError, match=r"^x: config.json has no 'd_model'$"):
        architecture({"model_type": "llada", "n_layers": 2}, "x")
    with pytest.raises(EstimateError, match="not a supported family"):
        architecture({"model_type": "gpt2"}, "x")


def test_documented_tables_are_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/tensor_parallel.md's "Memory per rank" shows the command's output verbatim."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "tensor_parallel.md").read_text()
    command = next(line for line in doc.splitlines() if line.startswith("python -m dlmsearch.estimate "))
    assert main(shlex.split(command)[3:]) == 0
    assert capsys.readouterr().out.strip() in doc


def test_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dlmsearch.estimate", "--preset", "llada-8b", "--tp", "3"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: llada-8b: N=3 does not divide num_attention_heads=32\n"
