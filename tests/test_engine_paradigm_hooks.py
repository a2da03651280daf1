"""The paradigm reaches the engine through its seams (issue 48, item 1): the adapter fills the open
positions a call carries, the encoder prefix is the cache policy an encoder-decoder model runs, a
model without a mask token claims none, and the slots' stores move through one protocol."""

from __future__ import annotations

import pytest
import torch
from conftest import MASK_ID, VOCAB, plan_on, tiny_denoiser
from diffusion_gemma_models import tiny_adapter, tiny_diffusion_gemma

from dlmsearch.core.capabilities import ModelCapabilities, open_marker
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.diffusion_gemma import DiffusionGemmaAdapter
from dlmsearch.search.engine.cache_policy import (
    BlockCache,
    EncoderPrefixCache,
    ModelsExact,
    NoCache,
    PrefixCache,
    cache_policy,
    for_model,
)
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.engine.slot_memory import SlotMemory

torch.set_num_threads(1)


def _capabilities(**changes: object) -> ModelCapabilities:
    fields = dict(name="m", vocab_size=8, mask_id=7, stop_ids=(1,), max_length=None, cache_policies=("none",))
    fields.update(shadow=False, shift_logits=False, honours_padding=True, compiles=False)
    return ModelCapabilities(**{**fields, **changes})


def test_cache_auto_picks_each_model_its_own_exact_cache() -> None:
    encoder, block, plain = _capabilities(encoder=True), _capabilities(attention_block=4), _capabilities()
    assert isinstance(for_model(ModelsExact(), encoder), EncoderPrefixCache)
    assert isinstance(for_model(cache_policy("none"), encoder), EncoderPrefixCache)  # it has no forward without it
    assert isinstance(for_model(ModelsExact(), block), BlockCache)
    assert isinstance(for_model(cache_policy("none"), block), NoCache)
    assert isinstance(for_model(ModelsExact(), plain), NoCache)
    assert isinstance(for_model(PrefixCache(), encoder), PrefixCache)  # the plan refuses it, in one line
    assert cache_policy("encoder").name == "encoder" and not cache_policy("encoder").stores


def test_a_masked_model_reads_the_mask_at_open_positions_and_draws_nothing() -> None:
    adapter = ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB)
    tokens = torch.tensor([[3, 4, 5, 6]])
    open_ = torch.tensor([[False, True, False, True]])
    drawn = lambda: pytest.fail("a masked model draws no noise")
    assert adapter.materialise(tokens, open_, drawn).tolist() == [[3, MASK_ID, 5, MASK_ID]]


def test_a_model_without_a_mask_token_reads_keyed_noise_there() -> None:
    adapter = tiny_adapter(tiny_diffusion_gemma(seed=0))
    vocab = adapter.vocab_size
    tokens = torch.tensor([[3, 4, 5, 6]])
    open_ = torch.tensor([[False, True, False, True]])
    uniform = torch.tensor([[0.9, 0.0, 0.5, 1.0]], dtype=torch.float64)
    filled = adapter.materialise(tokens, open_, lambda: uniform)
    assert filled.tolist() == [[3, 0, 5, vocab - 1]]  # floor(u * V), clamped below V
    assert adapter.materialise(tokens, torch.zeros_like(open_), lambda: pytest.fail("nothing open")) is tokens
    assert adapter.mask_id is None and adapter.capabilities.mask_id is None
    assert adapter.capabilities.open_id == open_marker(None, vocab) == vocab  # the loop's marker, never read
    assert adapter.capabilities.cache_policies == ("encoder",) and adapter.capabilities.encoder


def test_ids_that_do_not_exist_are_refused_in_one_line() -> None:
    model = tiny_diffusion_gemma(seed=0)
    with pytest.raises(ValueError, match=r"^DiffusionGemma has no mask token: model.mask_id must be null, got 96$"):
        DiffusionGemmaAdapter(module=model, mask_id=96, vocab_size=96, canvas_length=model.config.canvas_length)
    with pytest.raises(
        ValueError, match=r"^model.mask_id is null, but \w+ reads the mask token at every open position"
    ):
        ModelAdapter(module=tiny_denoiser(), mask_id=None, vocab_size=VOCAB)


def test_slot_memory_moves_every_store_through_one_protocol() -> None:
    """Each store is reset, reordered, widened, admitted and split alike: the slots stay in step."""
    memory = SlotMemory.for_slots(2)
    memory.prefixes.end[:] = torch.tensor([3, 5])
    memory.conditioning.start[:] = torch.tensor([3, 5])
    memory.reorder(torch.tensor([1, 1]))
    assert memory.prefixes.end.tolist() == [5, 5] and memory.conditioning.start.tolist() == [5, 5]
    memory.admit(1, widen=2)
    assert memory.prefixes.end.tolist() == [7, 7, -1] and memory.conditioning.start.tolist() == [7, 7, -1]
    assert memory.history.slots == 3 and len(memory.kv.window_of) == 3
    part = memory.split(torch.tensor([2]))
    assert part.prefixes.end.tolist() == [-1] and part.version == memory.version + 1
    assert memory.prefixes.end.tolist() == [7, 7, -1]  # the split leaves the running decode's stores alone


def test_the_encoder_cache_on_a_model_without_an_encoder_is_refused_in_one_line() -> None:
    engine = RolloutEngine(
        adapter=ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB), cache="encoder"
    )
    with pytest.raises(
        ValueError, match=r"^cache=encoder is the prefix cache of an encoder-decoder model .*: use `cache=none`$"
    ):
        plan_on(engine)
