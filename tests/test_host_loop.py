"""The lean host loop: draws computed only where a component reads them, rows put without cloning
what does not change."""

from __future__ import annotations

import pytest
import torch
from conftest import make_requests, text_decoder

from dlmsearch.search.engine import rollout as engine_module
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import Evaluation

torch.set_num_threads(1)


@pytest.mark.parametrize(
    "preset, overrides, draws",
    [
        ("llada", (), False),  # confidence ordering at temperature 0: nothing reads a draw
        ("adalook", (), False),
        ("llada", ("decoder.commit.ordering=random",), True),
        ("dream", ("decoder.commit.alg_temp=0.5", "decoder.sampling.temperature=0"), True),
        ("llada", ("engine.temperature=0.7",), True),  # token samples
    ],
)
def test_draws_are_made_only_where_read(
    adapter, monkeypatch, preset: str, overrides: tuple[str, ...], draws: bool
) -> None:
    made = []
    original = engine_module.hashed_uniform
    monkeypatch.setattr(engine_module, "hashed_uniform", lambda keys: made.append(1) or original(keys))
    engine_overrides = [o for o in overrides if o.startswith("engine.")]
    decoder = text_decoder(preset, *[o for o in overrides if not o.startswith("engine.")])
    temperature = float(engine_overrides[0].split("=")[1]) if engine_overrides else None
    engine = RolloutEngine(adapter=adapter, temperature=temperature)
    results = decoder.decode(engine, make_requests([3, 5], 16, seed=1), 8)
    assert all(r.steps > 0 for r in results)
    assert bool(made) == draws


def test_a_put_of_every_row_shares_the_new_tensors_and_a_partial_put_leaves_the_old_record_alone() -> None:
    old = Evaluation(token=torch.zeros(3, 4, dtype=torch.long), confidence=torch.zeros(3, 4))
    new = Evaluation(token=torch.ones(3, 4, dtype=torch.long), confidence=torch.ones(3, 4))
    whole = old.put(torch.arange(3), new)
    assert whole.token is new.token and whole.confidence is new.confidence
    part = old.put(torch.tensor([1]), new.take(torch.tensor([0])))
    assert part.token[:, 0].tolist() == [0, 1, 0] and old.token.sum() == 0  # the old record is never written
    mask = old.put(torch.tensor([True, False, True]), new.take(torch.tensor([0, 2])))
    assert mask.confidence[:, 0].tolist() == [1, 0, 1]
