"""The import graph reads top-down: models/ never imports search/, no package imports one above
it, and no module imports itself back through a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dlmsearch"

# Lower layers first; a module may import its own layer or any layer before it.
LAYERS = [
    ["validation", "stats", "core", "shipped"],
    ["models"],
    ["search.records"],
    ["search.engine", "search.components"],
    ["search.width"],
    ["search.plan", "search.plan_rules"],
    ["search.decode"],
    ["search.driver"],
    ["search.session", "search.batcher"],
    ["tasks", "run_records", "run_trace", "run_dir", "hydra_job", "sweeps", "distributed"],
    ["config", "run", "startup"],
    ["api", "lm_eval", "training", "estimate", "__main__"],
    ["serve"],
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The dlmsearch modules ``path`` imports, at module level, inside functions or for type checking
    only (a type-only import is still a dependency a reader follows, and a circle through one is a
    circle)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dlmsearch"):
            base = node.module.removeprefix("dlmsearch").lstrip(".")
            found |= {
                f"{base}.{alias.name}".lstrip(".")
                if (PACKAGE / base.replace(".", "/") / f"{alias.name}.py").exists()
                else base
                for alias in node.names
            }
        elif isinstance(node, ast.Import):
            found |= {
                alias.name.removeprefix("dlmsearch.") for alias in node.names if alias.name.startswith("dlmsearch.")
            }
    return {name for name in found if name}


def layer(name: str) -> int:
    matches = [
        i for i, group in enumerate(LAYERS) for prefix in group if name == prefix or name.startswith(prefix + ".")
    ]
    assert matches, f"module {name} is in no layer of tests/test_import_graph.py: place it"
    return max(matches)


GRAPH = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_imports_one_above_it(module: str) -> None:
    above = sorted(name for name in GRAPH[module] if layer(name) > layer(module))
    assert not above, f"{module} (layer {layer(module)}) imports {above} from above it"


def test_models_never_import_search() -> None:
    offenders = {
        m: sorted(n for n in names if n.startswith("search")) for m, names in GRAPH.items() if m.startswith("models")
    }
    assert not any(offenders.values()), offenders


def test_no_circles() -> None:
    modules = {m: {n for n in names if n in GRAPH} for m, names in GRAPH.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(modules[node]):
            if state.get(nxt) == 1:
                raise AssertionError(
                    "import circle: " + " -> ".join(path[path.index(nxt) :] + [nxt]) if nxt in path else nxt
                )
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module, [module])
