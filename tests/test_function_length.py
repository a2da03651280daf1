"""Two rules of the package's shape, read from its source (no import): no function is longer than
``MAX_LINES`` lines, and every function that takes ``MIN_DOCUMENTED`` or more parameters (``self``
and ``cls`` not counted) documents each of them in a Google-style ``Args:`` block, or, implementing an
interface method that does, names it (``Args: as :meth:`CachePolicy.columns`.``) instead of a copy."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dlmsearch"
MAX_LINES = 80
MIN_DOCUMENTED = 6

Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions() -> Iterator[tuple[str, Function]]:
    """Every function and method in the package, with where it is (``path:line``)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node


def parameters(node: Function) -> list[str]:
    """The function's parameter names, ``self`` and ``cls`` left out."""
    args = node.args
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    named += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in named if name not in ("self", "cls")]


def args_block(docstring: str) -> str | None:
    """The docstring's ``Args:`` section (up to the next section heading or the end), or None."""
    match = re.search(r"^\s*Args:\s*$(.*?)(?=^\s*[A-Z][A-Za-z ]*:\s*$|\Z)", docstring, re.MULTILINE | re.DOTALL)
    return None if match is None else match.group(1)


def undocumented(node: Function) -> list[str]:
    """The parameters that the ``Args:`` block does not describe (every one, where there is no block)."""
    docstring = ast.get_docstring(node) or ""
    if re.search(r"^\s*Args: as :meth:`[^`]+`\.\s*$", docstring, re.MULTILINE):
        return []  # an implementation of a documented interface method names it instead of copying its block
    block = args_block(docstring)
    if block is None:
        return parameters(node)
    return [
        name
        for name in parameters(node)
        if not re.search(rf"^\s*\**{re.escape(name)}( \(.*?\))?:", block, re.MULTILINE)
    ]


def test_no_function_is_longer_than_the_limit() -> None:
    long = [
        f"{where} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for where, node in functions()
        if node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long, f"longer than {MAX_LINES} lines, split into named parts:\n" + "\n".join(long)


def test_functions_with_many_parameters_document_them() -> None:
    missing = [
        f"{where} {node.name}: {', '.join(names)}"
        for where, node in functions()
        if len(parameters(node)) >= MIN_DOCUMENTED and (names := undocumented(node))
    ]
    assert not missing, f"{MIN_DOCUMENTED}+ parameters without an Args: entry:\n" + "\n".join(missing)
