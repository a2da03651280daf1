"""Two revision cards side by side (a change's before and after), each row paired item by item.

Rows are matched by tier and label; for each: accuracy, mean steps and revisions before and after,
and the exact sign test over the items only one of the two solved. Items must be the same.

    python experiments/compare_cards.py BEFORE/revision_card.json AFTER/revision_card.json      # prints the table
    python experiments/compare_cards.py BEFORE/revision_card.json AFTER/revision_card.json \
        --out experiments/results/revision/before_after.md --write-committed
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from outputs import add_flag, check

from dlmsearch import run_records as records


def compare(before: list[dict], after: list[dict]) -> list[str]:
    """Markdown rows for every (tier, label) in both cards."""
    earlier = {(r["task"], r["tier"], r["label"]): r for r in before}
    lines = [
        "| tier | decoder | accuracy before → after | steps before → after | revisions before → after | only after / only before (p) |",
        "|---|---|---|---|---|---|",
    ]
    for row in after:
        old = earlier.get((row["task"], row["tier"], row["label"]))
        if old is None:
            continue
        assert old["ids"] == row["ids"], f"{row['label']}: the cards decoded different items"
        found = records.paired(
            {i: i in row["solved_ids"] for i in row["ids"]}, {i: i in old["solved_ids"] for i in old["ids"]}
        )
        same = found["only_config"] == found["only_baseline"] == 0 and old["mean_steps"] == row["mean_steps"]
        lines.append(
            f"| {row['task']} {row['tier']} | {row['label']} | {100 * old['accuracy']:.1f} → {100 * row['accuracy']:.1f} % | "
            f"{old['mean_steps']} → {row['mean_steps']} | {old.get('mean_revisions', 0)} → {row.get('mean_revisions', 0)} | "
            + (
                "same items solved, same steps and revisions"
                if same and old.get("mean_revisions") == row.get("mean_revisions")
                else f"{found['only_config']} / {found['only_baseline']} (p = {found['sign_p']:.3g})"
            )
            + " |"
        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (Markdown)")
    add_flag(parser, "table (an --out under experiments/results/)")
    args = parser.parse_args(argv)
    check(parser, args, args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
