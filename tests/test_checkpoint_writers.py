"""The checkpoint writers are the family readers turned around: a written ``config.json`` reads back to
the config it was written from, and every native parameter name maps to a checkpoint name and back."""

from __future__ import annotations

import pytest

from dlmsearch.models.families import DREAM, FAMILIES, LLADA, SDAR, Family
from dlmsearch.models.llada_checkpoint import family_name, llada_config
from dlmsearch.models.sdar_checkpoint import sdar_config
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig

# off every reader's default, so that a field the writer dropped or misnamed reads back differently
SHAPE = {
    "vocab_size": 96,
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 64,
    "max_length": 96,
    "rope_theta": 5e5,
    "rms_norm_eps": 1e-4,
}
LLADA_SHAPE = TransformerConfig(**SHAPE, activation="gelu", tie_embeddings=False, rope_in_float32=False)
SDAR_SHAPE = TransformerConfig(
    **SHAPE, qkv_bias=False, qk_norm=True, head_dim=16, block_size=8, tie_embeddings=True, rope_in_float32=False
)


def test_a_written_llada_config_reads_back() -> None:
    written = llada_config(LLADA_SHAPE, mask_id=1, eos_id=2, pad_id=2)
    assert LLADA.read_config(written) == LLADA_SHAPE
    assert written["vocab_size"] == written["embedding_size"] == 96


def test_a_written_sdar_config_reads_back() -> None:
    assert SDAR.read_config(sdar_config(SDAR_SHAPE, mask_id=1, eos_id=2, pad_id=2)) == SDAR_SHAPE


def test_written_holds_what_the_reader_requires() -> None:
    for family in FAMILIES.values():
        reader = family.read_config
        written = reader.written(SDAR_SHAPE)
        assert {key: written[key] for key in reader.requires} == {k: v[0] for k, v in reader.requires.items()}


@pytest.mark.parametrize(
    ("family", "config"), [(LLADA, LLADA_SHAPE), (DREAM, TransformerConfig(**SHAPE)), (SDAR, SDAR_SHAPE)]
)
def test_every_native_name_has_a_checkpoint_name(family: Family, config: TransformerConfig) -> None:
    names = BidirectionalTransformer(config).state_dict()
    assert all(family.native_name(family_name(name, family)) == name for name in names)
