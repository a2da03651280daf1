"""How many rows a forward can take on this device: ``engine.row_budget: auto``.

An estimate of one row's peak bytes from the model's shape, the canvas and the cache mode,
against the device's free memory with a margin (calibrated on CPU against the measured peak of
a forward and its summaries: the estimate is 0.9-1.2x the peak for the benchmark's tiny and 1b
shapes, experiments/row_budget_estimate.py). The out-of-memory back-off stays the safety net
(an estimate too large halves on the first failure). Per row, at the peak of one layer and of the
engine's summaries:

* a layer's activations: hidden state, queries, keys, values and the output (5 L d), the MLP's
  four ``L x intermediate`` tensors (gate, up, activation, product), and the attention scores
  ``heads x L x L`` in float32 (the math kernel materialises them; fused kernels need less);
* the vocabulary-sized float32 tensors of the summarised columns: logits, their float copy,
  probabilities, the processed distribution and one softmax temporary (5 C V);
* with a cache, the row's keys and values of every layer over the canvas and one lane of scratch
  columns, at most the summarised ones (2 layers (L + C) kv_heads head_dim; see ``kv_cache.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch

MARGIN = 0.6  # share of the free memory the rows may take
MAX_ROWS = 4096


def model_shape(module: torch.nn.Module) -> dict[str, int]:
    """The shape numbers of a native transformer or the Sudoku denoiser (``config`` attributes)."""
    config = getattr(module, "config", None)
    if config is None or not (hasattr(config, "hidden_size") or hasattr(config, "d_model")):
        raise ValueError(
            f"engine.row_budget=auto needs a model whose shape dlmsearch knows (the native models, the denoiser); "
            f"{type(module).__name__} is not one: give engine.row_budget=N"
        )

    def get(*names: str) -> int:
        for name in names:
            if getattr(config, name, None) is not None:
                return int(getattr(config, name))
        raise ValueError(
            f"engine.row_budget=auto: the model's config has none of {', '.join(names)}; give engine.row_budget=N"
        )

    hidden, heads = get("hidden_size", "d_model"), get("num_heads", "n_heads", "num_attention_heads")
    return {
        "hidden": hidden,
        "layers": get("num_layers", "n_layers", "num_hidden_layers"),
        "heads": heads,
        "kv_heads": int(getattr(config, "num_kv_heads", None) or getattr(config, "num_key_value_heads", None) or heads),
        "intermediate": get("intermediate_size", "d_ff", "mlp_hidden_size"),
        "vocab": get("vocab_size", "embedding_size"),
    }


def row_bytes(shape: dict[str, int], width: int, columns: int, element: int, cached: bool) -> int:
    """Peak bytes of one row: a canvas of ``width`` tokens, ``columns`` of them summarised."""
    hidden, heads = shape["hidden"], shape["heads"]
    layer = (5 * width * hidden + 4 * width * shape["intermediate"]) * element + heads * width * width * 4
    summaries = 5 * columns * shape["vocab"] * 4
    cache = 2 * shape["layers"] * (width + columns) * shape["kv_heads"] * (hidden // heads) * element if cached else 0
    return layer + summaries + cache


def free_bytes(device: str) -> int:
    """Free memory of ``device``: CUDA's own count, else the host's available memory."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30  # unknown: assume 8 GiB


def auto_row_budget(
    module: torch.nn.Module, device: str, dtype: torch.dtype, width: int, columns: int, cached: bool
) -> int:
    """Rows per forward that fit ``MARGIN`` of the free memory (at least one, at most ``MAX_ROWS``).

    Args:
        module: the model (its ``config`` gives the shape numbers, :func:`model_shape`).
        device: where the forward runs (its free memory is the budget).
        dtype: the model's parameter dtype (the activations' element size).
        width: the canvas's length in tokens.
        columns: the columns summarised per row.
        cached: whether the rows keep keys and values (a cache policy that stores them).
    """
    element = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    per_row = row_bytes(model_shape(module), width, columns, element, cached)
    return max(1, min(MAX_ROWS, int(MARGIN * free_bytes(device) // per_row)))
