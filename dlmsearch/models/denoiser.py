"""A small bidirectional transformer denoiser: the project's own model family.

It serves two jobs: the shipped Sudoku model (learned positions over 81 cells plus row, column
and box embeddings) and the tiny random models that tests build. Both are plain masked
diffusion denoisers: tokens in, logits for every position out, no causal mask.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch
from torch import nn

from dlmsearch.core import attention as pattern
from dlmsearch.core.capabilities import ModuleFeatures


@attrs.frozen
class DenoiserConfig:
    """Architecture of a :class:`BidirectionalDenoiser`; saved beside the weights as JSON."""

    vocab_size: int
    max_len: int
    d_model: int = 128
    n_layers: int = 8
    n_heads: int = 4
    d_ff: int = 512
    grid_side: int = 0  # 9 adds row/column/box embeddings for a 9x9 board; 0 for plain text


class BidirectionalDenoiser(nn.Module):
    """Pre-norm transformer encoder predicting every position's token distribution."""

    features = ModuleFeatures(
        explicit_attention=True
    )  # forward() takes an explicit attention mask and positions (WINO's shadow block)

    def __init__(self, config: DenoiserConfig) -> None:
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.max_len, config.d_model)
        if config.grid_side:
            side = config.grid_side
            box = round(side**0.5)
            cell = torch.arange(side * side)
            row, col = cell // side, cell % side
            self.register_buffer("row_id", row, persistent=False)
            self.register_buffer("col_id", col, persistent=False)
            self.register_buffer("box_id", (row // box) * box + col // box, persistent=False)
            self.row = nn.Embedding(side, config.d_model)
            self.col = nn.Embedding(side, config.d_model)
            self.box = nn.Embedding(side, config.d_model)
        layer = nn.TransformerEncoderLayer(
            config.d_model,
            config.n_heads,
            config.d_ff,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        attention: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[rows, length, vocab]``; ``attention_mask`` marks real (non-padding) tokens.
        ``attention`` (``[rows, length, length]`` bool: query may attend to key) with
        ``positions`` lays the rows out explicitly (WINO's shadow block)."""
        if attention is not None:
            if positions is None:
                raise ValueError("an explicit attention mask needs explicit positions")
            hidden = self.token(input_ids) + self.position(positions)
            if self.config.grid_side:
                hidden = (
                    hidden
                    + self.row(self.row_id[positions])
                    + self.col(self.col_id[positions])
                    + self.box(self.box_id[positions])
                )
            blocked = ~attention.bool().repeat_interleave(self.config.n_heads, dim=0)
            return self.head(self.norm(self.encoder(hidden, mask=blocked)))
        if attention_mask is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        else:
            positions = pattern.positions(attention_mask)
        hidden = self.token(input_ids) + self.position(positions)
        if self.config.grid_side:
            hidden = hidden + self.row(self.row_id) + self.col(self.col_id) + self.box(self.box_id)
        padding = None if attention_mask is None else ~attention_mask.bool()
        hidden = self.encoder(hidden, src_key_padding_mask=padding)
        return self.head(self.norm(hidden))

    def save(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(attrs.asdict(self.config), indent=2) + "\n")
        save_file(
            {k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(directory / "model.safetensors")
        )

    @classmethod
    def load(cls, directory: str | Path) -> BidirectionalDenoiser:
        """Load a model written by :meth:`save`; fails naming the missing file."""
        from safetensors.torch import load_file

        directory = Path(directory)
        for name in ("config.json", "model.safetensors"):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"model directory {directory} has no {name}")
        config = DenoiserConfig(**json.loads((directory / "config.json").read_text()))
        model = cls(config)
        model.load_state_dict(load_file(str(directory / "model.safetensors")))
        return model.eval()
