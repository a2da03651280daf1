"""docs/architecture.md names only what exists, and names every module (issue 48, item 4).

The map drifts silently when code moves; this keeps it true. What counts as a code symbol on the
page: a span in single backticks, outside fenced blocks, of one of these forms.

1. A path ending in ``.py`` or ``/`` (``search/plan.py``, ``conf/cache/``): relative to the
   repository root when its first folder is one there (``dlmsearch/``, ``tests/``, ``experiments/``,
   ``scripts/``, ``docs/``), else relative to ``dlmsearch/``. The file or folder must exist.
2. A dotted name starting with ``dlmsearch.``: its longest importable prefix is imported and the
   rest resolved by attribute.
3. A name whose first part starts with a capital letter and holds a lower-case one (``Canvas``,
   ``DecodePlan.temperature``, ``Stream.RENOISE``): the first part must be defined at module level
   in exactly one dlmsearch module (a second, different object of that name elsewhere fails: one
   word, one concept), the rest resolved by attribute (an attrs field, and an attribute a class only
   declares, as a protocol's ``ClassVar``, count). Names of other libraries that the page cites are
   listed in :data:`EXTERNAL` and not resolved.
4. Form 2 or 3 followed by a parameter list (``CachePolicy.hits(storage, slot, columns)``): the
   callable's parameters, ``self``/``cls`` left out, must be exactly those names in that order
   (annotations and defaults ignored; a last ``...`` allows more after them).

Anything else in backticks (lower-case dotted names such as ``model.tensor_parallel`` are
configuration keys, commands, values) is prose and not checked. Conversely, every module of the
package (each ``*.py`` under ``dlmsearch/`` but ``__init__.py``) must be named in form 1.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path

import attrs
import pytest

import dlmsearch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlmsearch"
PAGE = ROOT / "docs" / "architecture.md"
TOP_FOLDERS = {"dlmsearch", "tests", "experiments", "scripts", "docs"}
EXTERNAL = {"DynamicCache", "GenerationConfig", "ModuleList", "DeviceMesh"}  # transformers' and torch's

PATH = re.compile(r"^[\w./-]+(\.py|/)$")
DOTTED = re.compile(r"^dlmsearch(\.\w+)+$")
CLASS_NAME = re.compile(r"^[A-Z]\w*[a-z]\w*(\.\w+)*$")
CALL = re.compile(r"^(?P<name>[\w.]+)\((?P<params>.*)\)$")


def spans() -> list[str]:
    """The single-backtick spans of the page outside fenced blocks."""
    text = re.sub(r"^```.*?^```", "", PAGE.read_text(), flags=re.DOTALL | re.MULTILINE)
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)


def symbols() -> list[str]:
    """Every span that is a code symbol under the docstring's convention."""
    return [s for s in spans() if PATH.match(s) or _name(s) is not None]


def _name(span: str) -> str | None:
    call = CALL.match(span)
    name = call.group("name") if call else span
    return name if DOTTED.match(name) or CLASS_NAME.match(name) else None


def resolve_path(span: str) -> Path:
    first = span.split("/", 1)[0]
    return (ROOT if first in TOP_FOLDERS else PACKAGE) / span


@cache
def definitions() -> dict[str, list[object]]:
    """Module-level names defined in dlmsearch (not imported), each with its distinct objects."""
    found: dict[str, list[object]] = {}
    for info in pkgutil.walk_packages(dlmsearch.__path__, "dlmsearch."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) == info.name and getattr(value, "__qualname__", name) == name:
                objects = found.setdefault(name, [])
                if all(value is not other for other in objects):
                    objects.append(value)
    return found


def _attribute(owner: object, name: str) -> object:
    if hasattr(owner, name):
        return getattr(owner, name)
    if inspect.isclass(owner) and attrs.has(owner) and name in attrs.fields_dict(owner):
        return attrs.fields_dict(owner)[name]
    if inspect.isclass(owner) and any(name in vars(k).get("__annotations__", {}) for k in owner.__mro__):
        return name  # declared only (a protocol's ClassVar): nothing further resolves through it
    raise AttributeError(f"{owner!r} has no {name!r}")


def resolve_name(name: str) -> object:
    parts = name.split(".")
    if parts[0] == "dlmsearch":
        for cut in range(len(parts), 0, -1):
            try:
                value: object = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        rest = parts[cut:]
    else:
        objects = definitions().get(parts[0], [])
        assert objects, f"no dlmsearch module defines {parts[0]}"
        assert len(objects) == 1, f"{parts[0]} names {len(objects)} things: " + ", ".join(
            f"{o.__module__}.{parts[0]}" for o in objects
        )
        value, rest = objects[0], parts[1:]
    for part in rest:
        value = _attribute(value, part)
    return value


def parameters(target: object) -> list[str]:
    names = [p.name for p in inspect.signature(target).parameters.values()]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def listed(params: str) -> list[str]:
    """``a: int, b=1, *, c, ...`` -> ``['a', 'b', 'c', '...']`` (a bare ``*`` dropped)."""
    names = [re.split(r"[:=]", p)[0].strip().lstrip("*") for p in params.split(",") if p.strip()]
    return [n if n != ".." else "..." for n in names if n]


SYMBOLS = sorted(set(symbols()))


def test_the_convention_finds_symbols() -> None:
    assert len(SYMBOLS) > 50 and any(CALL.match(s) for s in SYMBOLS), SYMBOLS


@pytest.mark.parametrize("span", SYMBOLS)
def test_every_named_symbol_exists(span: str) -> None:
    if PATH.match(span):
        assert resolve_path(span).exists(), f"docs/architecture.md names `{span}`, which does not exist"
        return
    name = _name(span)
    assert name is not None
    if name.split(".")[0] in EXTERNAL:
        return
    try:
        target = resolve_name(name)
    except (AttributeError, ImportError) as error:
        pytest.fail(f"docs/architecture.md names `{span}`: {error}")
    call = CALL.match(span)
    if call:
        want, got = listed(call.group("params")), parameters(target)
        if want[-1:] == ["..."]:
            want, got = want[:-1], got[: len(want) - 1]
        assert got == want, f"docs/architecture.md gives `{span}`; the code has {name}({', '.join(parameters(target))})"


def test_every_module_is_named() -> None:
    named = {resolve_path(s).resolve() for s in SYMBOLS if PATH.match(s)}
    missing = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and p.resolve() not in named
    )
    assert not missing, f"docs/architecture.md does not name these modules: {missing}"


def test_the_convention_reads_the_forms() -> None:
    """The parser itself: what is a symbol and what is prose (this test can fail if the regexes drift)."""
    assert _name("Canvas.open_positions") == "Canvas.open_positions"
    assert _name("CachePolicy.hits(storage, slot, columns)") == "CachePolicy.hits"
    assert _name("dlmsearch.search.plan.RULES") == "dlmsearch.search.plan.RULES"
    assert _name("model.tensor_parallel") is None and _name("cache=block") is None and _name("RULES") is None
    assert PATH.match("search/plan.py") and PATH.match("conf/cache/") and not PATH.match("python -m dlmsearch")
    assert listed("start, end: int, *, first=None, ...") == ["start", "end", "first", "..."]
