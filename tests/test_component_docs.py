"""docs/components.md lists every component's parameters as the code has them (``dlmsearch.component_docs``)."""

from __future__ import annotations

import inspect

import attrs
import pytest

from dlmsearch import component_docs as docs


def test_the_page_is_current() -> None:
    page = docs.PAGE.read_text()
    assert docs.current(page) == page, (
        f"{docs.PAGE.relative_to(docs.PAGE.parents[1])} is out of date with the component classes and their YAML; "
        f"refresh it with: {docs.REFRESH}"
    )


def test_check_mode_says_how_to_refresh(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert docs.main(["--check"]) == 0
    monkeypatch.setattr(docs, "generate", lambda: "stale\n")
    assert docs.main(["--check"]) == 1
    assert docs.REFRESH in capsys.readouterr().err


@pytest.mark.parametrize("group", docs.groups())
def test_every_option_is_listed_and_every_key_is_a_parameter(group: str) -> None:
    """Each option's section is on the page, and each key its file sets is a parameter of the class
    it builds (so every row the page shows is one a user can set)."""
    page = docs.PAGE.read_text()
    assert f"## `{group}`" in page
    for option in docs.options(group):
        assert f"**`{option.name}`**" in page, f"{group}/{option.name} is missing from the page"
        target = option.config.get("_target_", docs.DECODER)
        obj, cls = docs.resolve(target)
        known = {a.name for a in docs.settable(cls)} | (set() if obj is cls else set(inspect.signature(obj).parameters))
        unknown = set(option.config) - docs.HYDRA_KEYS - known
        assert not unknown, (
            f"conf/{group}/{option.name}.yaml sets {sorted(unknown)}, which {cls.__name__} does not take"
        )


def test_summary_is_the_first_sentence() -> None:
    @attrs.define
    class Example:
        """A rule (see :class:`~dlmsearch.search.driver.SearchDecoder`, i.e. the loop). More ``text``."""

    assert docs.summary(Example) == "A rule (see `SearchDecoder`, i.e. the loop)."
