"""The cross-object refusals are one numbered list (issue 36, item 6): plan.RULES, in order."""

from __future__ import annotations

import re

from dlmsearch.search import plan


def test_the_rules_are_numbered_in_order() -> None:
    numbers = [int(re.match(r"(\d+)\. ", rule.__doc__ or "").group(1)) for rule in plan.RULES]
    assert numbers == list(range(1, len(plan.RULES) + 1))


def test_nothing_but_the_plan_refuses_a_combination() -> None:
    """The engine and the adapter set up; they name no cache, compile or decoder rule."""
    import inspect

    from dlmsearch.search.engine.rollout import RolloutEngine

    assert "raise" not in inspect.getsource(RolloutEngine.__attrs_post_init__)
