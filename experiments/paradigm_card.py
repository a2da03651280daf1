"""Three diffusion paradigms on one task: the Countdown models in LLaDA's format (masked diffusion,
full attention), SDAR's (block diffusion) and DiffusionGemma's (uniform noise), trained alike on one
mix of three- and four-number problems (``experiments/train_countdown_mix.sh``), and the block
model's full-attention ablation, decoded by every preset each can run on the three-number tiers
(small, medium, d1) and the four-number ones (small4, medium4).

Every row goes through the normal runner into ``--runs/<model>/<tier>/<label>`` (an interrupted card
resumes), has a Wilson 95 % interval, and is paired (exact sign test) with its model's reference
rule on the same problems: ``llada`` (LLaDA's ``generate``) on the LLaDA-format model and on the
ablation, ``sdar`` (SDAR's ``block_diffusion_generate``) on the block model, ``diffusion_gemma``
(transformers' ``generate``) on the uniform-noise model. A preset a model cannot run is one row
saying why. The verdict tables pair the rows each claim is about (adaptive against fixed depth,
lookahead against thresholds, width with and without the verifier, revisions, caches, order).

The card, rows and figure go to ``--out`` (default ``runs/paradigm_card/``; with
``--write-committed``, the committed ``experiments/results/paradigm/``).

    python experiments/paradigm_card.py --write-committed      # the committed card (results/paradigm/)
    python experiments/paradigm_card.py --limit 16 --runs /tmp/pc --out /tmp/pc/card --tiers small small4
    python experiments/paradigm_card.py --dir llada=dlmsearch/data/countdown_model   # another directory for a model
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import attrs
import torch
from block_model_card import EVERY_TIER as BLOCK_EVERY_TIER
from block_model_card import NEEDS_FULL_ATTENTION
from block_model_card import SMALL_ONLY as BLOCK_SMALL_ONLY
from decoder_table import measure, paired
from outputs import RUNS, add_flag, check, resolve
from uniform_model_card import EVERY_TIER as UNIFORM_EVERY_TIER
from uniform_model_card import SMALL_ONLY as UNIFORM_SMALL_ONLY

from dlmsearch.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "paradigm"
TRAINED = ROOT / "runs" / "mix"
SHIPPED_CARDS = {  # the shipped models (three-number training, 16-token answers), as their own cards measured them
    "llada": ROOT / "experiments" / "results" / "block" / "rows.json",
    "block": ROOT / "experiments" / "results" / "block" / "rows.json",
    "uniform": ROOT / "experiments" / "results" / "uniform" / "rows.json",
}  # experiments/train_countdown_mix.sh writes each model to TRAINED/<name>/model
MAIN_TIERS = ("small", "small4")  # every preset; the other tiers run EVERY_TIER only
CPU = ["task=countdown", "model.device=cpu"]
Variant = tuple[str, str, list[str]]  # (label, preset, overrides)


@attrs.frozen
class Model:
    """One model of the card: how it loads, its reference rule, and what it decodes on each tier."""

    name: str
    base: tuple[str, ...]
    reference: str
    every_tier: tuple[Variant, ...]
    main_only: tuple[Variant, ...]
    note: str

    def variants(self, tier: str) -> list[Variant]:
        return [*self.every_tier, *(self.main_only if tier in MAIN_TIERS else ())]


def _plain(presets: list[str]) -> tuple[Variant, ...]:
    return tuple((p, p, []) for p in presets)


OWN_BLOCKS = {"wino", "dream"}  # presets with their own block length: on the block model they adopt its blocks
CACHES = tuple(
    (f"{preset}_{cache}", preset, [f"cache={cache}"])
    for preset in ("fast_dllm", "adalook")
    for cache in ("prefix", "dual")
)
BLOCK_CACHE = tuple((f"{preset}_nocache", preset, ["cache=none"]) for preset in ("sdar_greedy", "adalook"))
MODELS = {
    "llada": Model(
        "llada",
        ("model=countdown", *CPU),
        "llada",
        _plain([*BLOCK_EVERY_TIER, "random"]),
        (*_plain([p for p in BLOCK_SMALL_ONLY if p not in BLOCK_EVERY_TIER]), *_plain(["verified_best_of_n"]), *CACHES),
        "LLaDA's format: masked diffusion, full attention",
    ),
    "block": Model(
        "block",
        ("model=countdown_block", *CPU, "cache=block"),
        "sdar",
        _plain([*BLOCK_EVERY_TIER, "random"]),
        (
            *[
                (p, p, ["decoder.block_length=null"] if p in OWN_BLOCKS else [])
                for p in BLOCK_SMALL_ONLY
                if p not in BLOCK_EVERY_TIER
            ],
            *_plain(["verified_best_of_n"]),
            *BLOCK_CACHE,
        ),
        "SDAR's format: block diffusion, blocks of 4, exact block cache",
    ),
    "block_full": Model(
        "block_full",
        ("model=countdown_block", *CPU, "model.full_attention=true"),
        "llada",
        _plain(["llada", "sdar_greedy", "fast_dllm", "adalook", "random"]),
        _plain(["fixed_depth", "ete", "best_of_n", "verified_best_of_n"]),
        "the ablation: the block model's architecture and objective, trained and decoded with full attention",
    ),
    "uniform": Model(
        "uniform",
        ("model=countdown_uniform", *CPU, "model.block_length=${diffusion_gemma:canvas_length}"),
        "diffusion_gemma",
        tuple(UNIFORM_EVERY_TIER),
        tuple(UNIFORM_SMALL_ONLY),
        "DiffusionGemma's format: uniform noise, encoder-decoder over one canvas",
    ),
}
# The verdicts: (paradigm, claim, model, this label, against label); each a paired row per tier
VERDICTS = (
    [
        ("order", "random order against the reference rule", m, "random", MODELS[m].reference)
        for m in ("llada", "block", "block_full")
    ]
    + [
        ("adaptive depth", "AdaLook's gate against fixed depth 2", m, "adalook", "fixed_depth")
        for m in ("llada", "block", "block_full", "uniform")
    ]
    + [
        ("lookahead vs thresholds", "AdaLook against Fast-dLLM's threshold", m, "adalook", "fast_dllm")
        for m in ("llada", "block", "block_full")
    ]
    + [
        ("lookahead vs thresholds", "ETE against Fast-dLLM's threshold", m, "ete", "fast_dllm")
        for m in ("llada", "block", "block_full")
    ]
    + [
        ("width", "best-of-N (model's own score) against the reference", m, "best_of_n", MODELS[m].reference)
        for m in MODELS
    ]
    + [
        (
            "width",
            "best-of-N with the task's verifier against the reference",
            m,
            "verified_best_of_n",
            MODELS[m].reference,
        )
        for m in MODELS
    ]
    + [
        ("revisions", f"{p} against the reference", m, p, MODELS[m].reference)
        for m in ("llada", "block")
        for p in ("remdm", "rcr", "wino", "saber", "llada21")
    ]
    + [
        (
            "caches",
            f"{label.rsplit('_', 1)[0]} with cache={label.rsplit('_', 1)[1]} against no cache",
            "llada",
            label,
            label.rsplit("_", 1)[0],
        )
        for label in ("fast_dllm_prefix", "fast_dllm_dual", "adalook_prefix", "adalook_dual")
    ]
    + [
        (
            "caches",
            f"{label.split('_nocache')[0]} with no cache against the exact block cache",
            "block",
            label,
            label.split("_nocache")[0],
        )
        for label in ("sdar_greedy_nocache", "adalook_nocache")
    ]
)


def directories(args: argparse.Namespace) -> dict[str, Path]:
    """Each model's directory: the trained run's ``model/`` unless ``--dir name=DIR`` says otherwise."""
    found = {name: TRAINED / name / "model" for name in MODELS}
    for given in args.dir:
        name, _, path = given.partition("=")
        if name not in MODELS or not path:
            raise SystemExit(f"--dir {given!r}: expected NAME=DIR with NAME one of {', '.join(MODELS)}")
        found[name] = Path(path)
    return found


def shown(path: Path) -> str:
    """A path as the card prints it: relative to the repository where it lies inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def row(model: Model, directory: Path, tier: str, variant: Variant, args: argparse.Namespace) -> dict:
    """One run (resumed if it already ran), or a row saying why the model cannot run the preset."""
    label, preset, overrides = variant
    if (
        model.name == "block"
        and preset in NEEDS_FULL_ATTENTION | {"wino"}
        and not any(o.startswith("cache=") for o in overrides)
    ):
        overrides = [*overrides, "cache=none"]
    head = {"model": model.name, "tier": tier, "label": label, "preset": preset, "overrides": overrides}
    started = time.monotonic()
    try:
        found = measure(
            args.runs / model.name / tier / label,
            tier,
            label,
            preset,
            overrides,
            [*model.base, f"model.path={directory}"],
            args.limit,
            args.batch_size,
        )
    except (ConfigError, ValueError) as error:
        return {**head, "refused": str(error).splitlines()[-1]}
    return {**found, **head, "decode_seconds": round(time.monotonic() - started, 1)}


HEADER = [
    "| model | tier | decoder | overrides | solved | 95 % interval | steps | row-forwards | token-forwards | only this / only reference | sign p |",
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
]


def line(r: dict, reference: dict | None) -> str:
    if "refused" in r:
        return f"| {r['model']} | {r['tier']} | {r['label']} | refused: {r['refused']} |||||||"
    wins, losses, p = paired(r, reference) if reference and reference is not r else (0, 0, 1.0)
    return (
        f"| {r['model']} | {r['tier']} | {r['label']} | {' '.join(r['overrides']) or '-'} | {100 * r['accuracy']:.1f} % | "
        f"{100 * r['wilson_low']:.1f}-{100 * r['wilson_high']:.1f} | {r['mean_steps']:.1f} | {r['mean_row_forwards']:.1f} | "
        f"{r['mean_token_forwards']:.0f} | {wins} / {losses} | {p:.3g} |"
    )


PLAIN = {
    "llada",
    "sdar",
    "sdar_greedy",
    "sdar_static",
    "fast_dllm",
    "fast_dllm_factor",
    "llada2",
    "entropy_bounded",
    "eb_sampler",
    "pc_sampler",
    "klass",
    "dream",
    "diffusion_gemma",
}
"""One sequence, no lookahead, width or revision: the decoders a model's defaults choose among."""


def main_table(done: dict[tuple[str, str, str], dict], tiers: list[str]) -> list[str]:
    """Side by side per tier: each model's reference rule, its best plain decoder (:data:`PLAIN`) and its
    best decoder of all (ties: fewer token-forwards)."""
    lines = [
        "| tier | model | reference rule | best plain decoder | best decoder |",
        "|---|---|---:|---:|---:|",
    ]

    def cell(r: dict | None, named: bool = True) -> str:
        if r is None:
            return "-"
        return f"{r['label'] + ' ' if named else ''}{100 * r['accuracy']:.1f} % [{100 * r['wilson_low']:.1f}, {100 * r['wilson_high']:.1f}], {r['mean_token_forwards']:.0f} tf"

    names = [*MODELS, *(f"shipped_{m}" for m in SHIPPED_CARDS)]
    for tier in tiers:
        for name in names:
            reference = MODELS[name.removeprefix("shipped_")].reference
            rows = [r for (m, t, _), r in done.items() if m == name and t == tier]
            if not rows:
                continue
            best = max(rows, key=lambda r: (r["accuracy"], -r["mean_token_forwards"]))
            plain = max(
                (r for r in rows if r["preset"] in PLAIN and all(o.startswith("cache=") for o in r["overrides"])),
                key=lambda r: (r["accuracy"], -r["mean_token_forwards"]),
                default=None,
            )
            lines.append(
                f"| {tier} | {name} | {cell(done.get((name, tier, reference)), False)} | {cell(plain)} | {cell(best)} |"
            )
    return lines


def shipped_rows() -> dict[tuple[str, str, str], dict]:
    """The shipped models' committed card rows (block_model_card.py, uniform_model_card.py), keyed as the card's own."""
    found = {}
    for name, path in SHIPPED_CARDS.items():
        for r in json.loads(path.read_text()):
            if r["model"] == name and r.get("section", "presets") == "presets" and "refused" not in r:
                found[(f"shipped_{name}", r["tier"], r["label"])] = {**r, "model": f"shipped_{name}"}
    return found


def verdict_tables(done: dict[tuple[str, str, str], dict], tiers: list[str]) -> list[str]:
    """One table per paradigm of claims: each claim's pair per model and tier."""
    lines: list[str] = []
    for paradigm in dict.fromkeys(v[0] for v in VERDICTS):
        lines += [
            "",
            f"### {paradigm}",
            "",
            "| claim | model | tier | this | against | only this / only against | sign p | token-forwards, this / against |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for _, claim, model, this, against in (v for v in VERDICTS if v[0] == paradigm):
            for tier in tiers:
                a, b = done.get((model, tier, this)), done.get((model, tier, against))
                if a is None or b is None:
                    continue
                wins, losses, p = paired(a, b)
                lines.append(
                    f"| {claim} | {model} | {tier} | {100 * a['accuracy']:.1f} % | {100 * b['accuracy']:.1f} % | {wins} / {losses} | {p:.3g} | "
                    f"{a['mean_token_forwards']:.0f} / {b['mean_token_forwards']:.0f} |"
                )
    return lines


def plot(rows: list[dict], tiers: list[str], path: Path) -> None:
    """Accuracy against mean token-forwards, one panel per tier, every model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(tiers))
    lines = -(-len(tiers) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(6.5 * columns, 5 * lines), squeeze=False)
    markers = {"llada": "s", "block": "o", "block_full": "D", "uniform": "^"}
    for axis, tier in zip(axes.flat, tiers):
        for name, marker in markers.items():
            for model, hollow in ((name, False), (f"shipped_{name}", True)):
                points = [r for r in rows if r["tier"] == tier and r["model"] == model and "refused" not in r]
                if not points:
                    continue
                axis.scatter(
                    [r["mean_token_forwards"] for r in points],
                    [100 * r["accuracy"] for r in points],
                    marker=marker,
                    label=f"{model} model" + (" (three numbers only)" if hollow else ", mix"),
                    alpha=0.8,
                    **({"facecolors": "none", "edgecolors": "grey"} if hollow else {}),
                )
                for r in points:
                    if r["label"] == MODELS[name].reference and not hollow:
                        axis.annotate(
                            r["label"],
                            (r["mean_token_forwards"], 100 * r["accuracy"]),
                            fontsize=7,
                            xytext=(3, 2),
                            textcoords="offset points",
                        )
        axis.set_xscale("log")
        axis.set_xlabel("mean token-forwards per problem (log)")
        axis.set_ylabel("solved %")
        axis.set_title(f"Countdown {tier}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(tiers) :]:
        axis.axis("off")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=RUNS / "paradigm_card" / "runs")
    parser.add_argument(
        "--out", type=Path, default=None, help="the card, rows and figure (default runs/paradigm_card/)"
    )
    parser.add_argument("--dir", action="append", default=[], help="NAME=DIR: decode this directory as model NAME")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiers", nargs="+", default=["small", "small4", "medium", "medium4", "d1"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    add_flag(parser, "card in experiments/results/paradigm/")
    args = parser.parse_args(argv)
    check(parser, args)
    args.out = resolve(parser, args, args.out, OUT, RUNS / "paradigm_card")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    found = directories(args)
    rows = [
        row(MODELS[name], found[name], tier, variant, args)
        for name in args.models
        for tier in args.tiers
        for variant in MODELS[name].variants(tier)
    ]
    done = {(r["model"], r["tier"], r["label"]): r for r in rows if "refused" not in r}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    command = "python experiments/paradigm_card.py" + (f" --limit {args.limit}" if args.limit else "")
    lines = [
        f"Measured by `{command}` (batch {args.batch_size}, {args.threads} CPU threads). Models:",
        "",
        *[
            f"- `{m.name}` ({shown(found[m.name])}): {m.note}; reference rule `{m.reference}`."
            for m in MODELS.values()
            if m.name in args.models
        ],
        "",
        (
            "- `shipped_*`: the shipped models (trained on three numbers only, answers of 16 tokens), rows from their own "
            "committed cards (`experiments/block_model_card.py`, `experiments/uniform_model_card.py`); they cannot write a "
            "four-number answer, so they have no rows on small4 and medium4."
        ),
        "",
        "## Side by side (tf: mean token-forwards per problem)",
        "",
        *main_table({**done, **shipped_rows()}, args.tiers),
        "",
        "## Verdicts",
        *verdict_tables(done, args.tiers),
        "",
        "## Every row (paired with the model's reference rule on the same problems)",
        "",
        *HEADER,
        *[line(r, done.get((r["model"], r["tier"], MODELS[r["model"]].reference))) for r in rows],
    ]
    (args.out / "card.md").write_text("\n".join(lines) + "\n")
    plot([*rows, *shipped_rows().values()], args.tiers, args.out / "accuracy_vs_token_forwards.png")
    print("\n".join(lines[: 12 + len(args.tiers)]))
    print(f"wrote {args.out}/{{rows.json,card.md,accuracy_vs_token_forwards.png}}")


if __name__ == "__main__":
    main()
