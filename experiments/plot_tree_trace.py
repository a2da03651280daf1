"""Draw the search trees of one decoded problem from a ``trace=true`` run of a tree preset.

Each panel is one search (a round where the trigger fired): nodes by depth (top: the root), sized by
visits, coloured by mean value; edges labelled with the move (position:token); the committed node and
its path drawn thick; a node whose completion the verifier accepted ringed in green, a terminal loss
crossed. By default the item is the one with the largest search, and the panels its searches with the most nodes.

    python -m dlmsearch +decoder=mcts_verified model=sudoku task=sudoku task.tier=hard task.limit=4 trace=true out_dir=runs/tree_trace/sudoku
    python experiments/plot_tree_trace.py runs/tree_trace/sudoku/trace.jsonl --figure docs/tree_trace_sudoku.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_searches(path: Path, item: str | None) -> tuple[str, list[dict]]:
    """The item's id and its searches that ran simulations (``item`` None: the item whose largest search
    is the largest of the trace)."""
    found = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        searches = [s for s in record.get("lookahead", []) if "tree" in s and len(s["tree"]["parent"]) > 1]
        if searches and (item is None or record["id"] == item):
            found.append((max(len(s["tree"]["parent"]) for s in searches), record["id"], searches))
    if not found:
        raise SystemExit(
            f"{path}: no tree search traced{f' for {item}' if item else ''} (run a tree preset with trace=true)"
        )
    _, name, searches = max(found, key=lambda f: f[0])
    return name, searches


def layout(parent: list[int]) -> tuple[list[float], list[int]]:
    """x (leaves spread in depth-first order, a parent over its children's middle) and depth per node."""
    children: dict[int, list[int]] = {}
    for node, up in enumerate(parent):
        if up >= 0:
            children.setdefault(up, []).append(node)
    x, depth = [0.0] * len(parent), [0] * len(parent)
    next_leaf = [0.0]

    def place(node: int, level: int) -> float:
        depth[node] = level
        kids = children.get(node, [])
        if not kids:
            x[node] = next_leaf[0]
            next_leaf[0] += 1
        else:
            x[node] = sum(place(k, level + 1) for k in kids) / len(kids)
        return x[node]

    place(0, 0)
    return x, depth


def draw(axis, search: dict, color_map) -> object:
    tree, chosen = search["tree"], search["chosen"]
    parent, visits, value = tree["parent"], tree["visits"], tree["value"]
    x, depth = layout(parent)
    path = set()
    node = chosen
    while node >= 0:
        path.add(node)
        node = parent[node] if node > 0 else -1
    for node, up in enumerate(parent):
        if up < 0:
            continue
        on_path = node in path and up in path
        axis.plot(
            [x[up], x[node]], [-depth[up], -depth[node]], color="black" if on_path else "0.7", lw=3 if on_path else 1
        )
        if up != 0 and not on_path:
            continue  # moves labelled at the root and along the committed path only
        axis.annotate(
            f"{tree['position'][node]}:{tree['token'][node]}",
            ((x[up] + x[node]) / 2, -(depth[up] + depth[node]) / 2),
            fontsize=6,
            color="0.3",
        )
    sizes = [30 + 40 * v for v in visits]
    points = axis.scatter(
        x, [-d for d in depth], s=sizes, c=value, cmap=color_map, vmin=0, vmax=1, zorder=3, edgecolors="none"
    )
    for node in range(len(parent)):
        if tree["accepted"][node]:
            axis.scatter(
                [x[node]], [-depth[node]], s=sizes[node] + 80, facecolors="none", edgecolors="green", lw=2, zorder=4
            )
        elif tree["terminal"][node] and value[node] == 0:
            axis.scatter([x[node]], [-depth[node]], marker="x", color="red", s=40, zorder=4)
    axis.set_title(f"call {search['call']}: {len(parent)} nodes, committed node {chosen}", fontsize=9)
    axis.set_xticks([])
    axis.set_yticks(range(0, -max(depth) - 1, -1), [str(d) for d in range(max(depth) + 1)])
    axis.set_ylabel("depth (commits below the root)")
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="a run's trace.jsonl")
    parser.add_argument("--item", default=None, help="the item id (default: the first with a tree search)")
    parser.add_argument("--panels", type=int, default=4, help="searches drawn: those with the most nodes")
    parser.add_argument("--figure", type=Path, default=None, help="default: tree_trace.png beside the trace")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    item, searches = read_searches(args.trace, args.item)
    shown = sorted(sorted(searches, key=lambda s: -len(s["tree"]["parent"]))[: args.panels], key=lambda s: s["call"])
    figure, axes = plt.subplots(1, len(shown), figsize=(max(4.5 * len(shown), 8), 4.4), squeeze=False)
    points = None
    for axis, search in zip(axes[0], shown):
        points = draw(axis, search, plt.get_cmap("viridis"))
    figure.colorbar(points, ax=axes[0].tolist(), label="mean value", shrink=0.8)
    figure.suptitle(
        f"{item}: {len(searches)} searches (edges: position:token); size = visits, thick = committed, green ring = verified",
        fontsize=10,
    )
    out = args.figure or args.trace.parent / "tree_trace.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
