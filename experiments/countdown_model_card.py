"""Measure the shipped Countdown model: every decoder preset on every tier, the caches, block
lengths and candidate rules, and write its model card (``README.md`` beside the weights).

Runs go through the normal runner into ``--runs/<section>/<tier>/<label>`` (an interrupted card
resumes), with ``model=countdown task=countdown``: the papers' text settings (``decoding=text``:
C = 0.9, ``c_info`` = 0.2, the frontier before the block midpoint), ``gen_length`` 16 and
``block_length`` 8 unless a row says otherwise. Every row is paired with ``llada`` on the same
problems (exact sign test) and has a Wilson 95 % interval.

Everything is written under ``--runs`` (default ``runs/countdown_card/``) unless ``--write-committed``:
then the card is the shipped model's ``README.md`` and the figure ``docs/countdown_decoders.png``.

    python experiments/countdown_model_card.py --write-committed            # the shipped card and its figure (docs/countdown_decoders.png)
    python experiments/countdown_model_card.py --limit 32 --runs /tmp/card    # quick look (everything under /tmp/card)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from decoder_table import measure, paired, parse_variant, plot_accuracy_vs_steps, write_card
from outputs import add_flag, check
from safetensors.torch import load_file

from dlmsearch import run_records as records
from dlmsearch.config import compose, decoder_presets
from dlmsearch.tasks.arithmetic import wrong_steps
from dlmsearch.tasks.countdown import TIERS

ROOT = Path(__file__).resolve().parents[1]
BASE = ["model=countdown", "task=countdown", "model.device=cpu"]
CARD_TIERS = ["small", "medium", "large", "d1"]
# Width presets (4 particles, the costliest rows) run on the main tier and d1's split only.
WIDTH_PRESETS = ("best_of_n", "beam", "smc", "verified_best_of_n", "beam_adalook")
WIDTH_TIERS = ("small", "d1")
# Countdown's verifier checks complete equations only, so pruning partial particles is off.
PRESET_OVERRIDES = {"verified_best_of_n": ["decoder.population.prune_conflicts=false"]}
# section -> (tiers, rows); rows are label=preset:override,override
SECTIONS = {
    "cache": (
        ["small"],
        [f"{p}_{c}={p}:engine.cache={c}" for p in ("fast_dllm", "adalook") for c in ("none", "prefix", "dual")],
    ),
    "blocks": (
        ["small"],
        [f"{p}_b{b}={p}:task.block_length={b}" for p in ("llada", "random", "adalook") for b in (4, 8, 16)],
    ),
    "candidates": (
        ["small"],
        [
            f"{p}_{name}={p}:decoding.c_info={c}"
            for p in ("ete", "adalook")
            for name, c in (("cinfo0.2", 0.2), ("confidence", 1.0))
        ],
    ),
    "width": (
        ["small"],
        [
            "vote=best_of_n:decoder/population/choice=majority_vote",
            "best_of_n_P2=best_of_n:decoder.population.size=2",
            "verified_best_of_n_P2=verified_best_of_n:decoder.population.size=2,decoder.population.prune_conflicts=false",
        ],
    ),
}


def strict_accuracy(found: dict[str, records.Record]) -> dict[str, float]:
    """Share of items solved with every written step right (``task.strict_steps=true``), from the outputs."""
    strict = sum(bool(r.get("correct")) and not wrong_steps(r.get("output") or "") for r in found.values())
    return {"strict_accuracy": strict / max(len(found), 1)}


def row_line(r: dict, base: dict | None) -> str:
    wins, losses, p = paired(r, base) if base else (0, 0, 1.0)
    return (
        f"| {r['tier']} | {r['label']} | {' '.join(r['overrides']) or '-'} | {100 * r['accuracy']:.1f} % | "
        f"{100 * r['wilson_low']:.1f}-{100 * r['wilson_high']:.1f} | {100 * r['strict_accuracy']:.1f} % | {r['mean_steps']:.1f} | {r['mean_row_forwards']:.1f} | "
        f"{r['mean_token_forwards']:.0f} | {wins} / {losses} | {p:.3g} | {r['wall_seconds']:.0f} |"
    )


HEADER = [
    "| tier | decoder | overrides | solved | 95 % interval | solved, every step right | mean steps | mean row-forwards | mean token-forwards | only this / only llada | sign p | wall s |",
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def table(rows: list[dict], baselines: dict[str, dict]) -> list[str]:
    return HEADER + [row_line(r, baselines.get(r["tier"])) for r in rows]


def training_section(model: Path) -> list[str]:
    path = model / "training.json"
    if not path.exists():
        return ["(no training.json beside the weights)"]
    training = json.loads(path.read_text())
    m = training["machine"]
    lines = [
        (
            f"- {training['steps']} steps in {training['train_seconds'] / 60:.1f} minutes of training on {m['cores']} CPU cores "
            f"({m['cpu']}, torch {m['torch']}); loss (LLaDA's SFT loss, mean of the last 100 steps) {training['final_loss_last_100_steps']}."
        ),
        (
            f"- Command: `{training['command']}`, then `python experiments/ship_model.py --train-dir runs/countdown_train "
            "--dest dlmsearch/data/countdown_model --curve docs/countdown_learning_curve.png`."
        ),
        "",
        (
            "Held-out accuracy at each checkpoint (128 problems of the `validation` tier, numbers 1-20, never trained on; "
            "gen_length 16, one block):"
        ),
        "",
        "| step | training minutes | numbers drawn up to | llada | random |",
        "|---:|---:|---:|---:|---:|",
    ]
    for e in training["checkpoint_evals"]:
        got = {x["decoder"]: x["accuracy"] for x in e["eval"]}
        lines.append(
            f"| {e['step']} | {e['train_seconds'] / 60:.1f} | {e['numbers_up_to']} | {100 * got.get('llada', 0):.1f} % | {100 * got.get('random', 0):.1f} % |"
        )
    return lines + [
        "",
        "![learning curve](../../../docs/countdown_learning_curve.png)",
        "",
        (
            "The loss steps up at step ~1800, where the curriculum starts drawing 15 % of the problems from 1-100. "
            "An earlier run of the same recipe with one token per digit (`runs/countdown_train_chars`, not shipped) "
            "solved 0 % of the validation problems at step 1000 (20 training minutes); with every number one token "
            "this run reached 5.5 % at step 1000 and 24 % at step 2000."
        ),
    ]


def card(rows: list[dict], sections: dict[str, list[dict]], args: argparse.Namespace, command: str) -> str:
    config = json.loads((args.model / "config.json").read_text())
    params = sum(t.numel() for t in load_file(str(args.model / "model.safetensors")).values())
    baselines = {r["tier"]: r for r in rows if r["label"] == "llada"}
    lines = [
        "# Countdown model shipped with dlmsearch",
        "",
        (
            f"A {params / 1e6:.2f} M-parameter masked diffusion model in LLaDA's checkpoint format (`model_type: llada`, "
            f"LLaDA's parameter names; d_model {config['d_model']}, {config['n_layers']} layers, {config['n_heads']} heads, "
            f"SwiGLU MLP {config['mlp_hidden_size']}, RoPE theta {config['rope_theta']:g}, untied head), with a byte-level BPE "
            "tokenizer (`tokenizer.json`, loads with `AutoTokenizer.from_pretrained(dir)`, no remote code) in which every "
            "number 0-999 is one token, LLaDA's special tokens (`<|mdm_mask|>` 1402, `<|endoftext|>` 1401, `<|eot_id|>` 1405) "
            "and LLaDA-Instruct's chat template. It loads exactly as an 8B LLaDA does: `model=llada model.path=DIR "
            "model.mask_id=1402 model.vocab_size=1408 model.stop_ids=[1401,1405]`, or `model=countdown`, which is that "
            "plus the prompt it was trained on."
        ),
        "",
        (
            "Prompt (one user turn of the chat template): `Make {target} from {numbers}.`; answer: worked steps "
            "`a op b=x,x op c=t` (e.g. `Make 59 from 12, 5, 1.` -> `12*5=60,60-1=59`), then `<|eot_id|>`, then "
            "`<|endoftext|>` to the end of the 16-token generation. The judge composes the steps into one equation "
            "(`(12*5)-1`) and checks that it uses each number once and reaches the target."
        ),
        "",
        "## Training",
        "",
        (
            "- Data: problems drawn on the fly (`dlmsearch/tasks/countdown_problems.py`): three distinct numbers and a target "
            "drawn uniformly from the targets in 1-100 they reach with + - * / (every intermediate result a non-negative whole "
            "number), one of its worked answers drawn uniformly (commutative steps larger operand first). Curriculum: numbers "
            "from 1-10 growing to 1-20 over the first quarter of training, then 15 % of problems with numbers from 1-100. "
            "No problem whose number triple is in a shipped tier (small, medium, large, validation, d1) is ever drawn."
        ),
        (
            "- Objective: LLaDA's SFT. Only response tokens are masked, each with probability t ~ U(0, 1) per row (the "
            "EOS-filled tail included); cross-entropy of the masked tokens weighted by 1/t, divided by the response length."
        ),
        (
            "- AdamW (lr 2e-3, betas 0.9/0.98, weight decay 0.01), batch 128, 200 warm-up steps, cosine decay to 1e-4 over "
            "the training budget (minutes), 2 CPU threads."
        ),
        *training_section(args.model),
        "",
        "## Decoders on the held-out tiers",
        "",
        "Tiers (`task.tier`, each 256 problems with distinct number triples, never trained on): `small` numbers 1-20 (the "
        "main tier), `medium` 1-50, `large` 1-100, and `d1`, d1's public 3-number split. The papers' text settings "
        "(`decoding=text`): "
        + ", ".join(f"{k} = {v}" for k, v in compose(BASE).decoding.items())
        + f"; gen_length 16, block_length 8 (two blocks) unless a row overrides it; batch {args.batch_size}, "
        f"{torch.get_num_threads()} CPU threads per process. The width presets (4 particles) run on `small` and `d1`. Steps are sequential model calls, row-forwards rows summed over calls, "
        "token-forwards the positions computed (what a KV cache saves). Intervals are Wilson 95 %; the paired columns "
        "compare each row with `llada` on the same problems (solved only by the row / only by `llada`, exact two-sided "
        'sign test). "Solved" is the task\'s judge (the composed equation uses each number once and reaches the '
        "target, as d1's judge checks the final equation); \"every step right\" also requires each written step's "
        "claimed result to be right (`task.strict_steps=true`): the model sometimes writes two compensating slips "
        "(`17+14=29,29*3=93` composes to `(17+14)*3 = 93`).",
        "",
        *table(rows, baselines),
        "",
        "![accuracy vs steps](../../../docs/countdown_decoders.png)",
    ]
    titles = {
        "cache": "KV caches (the papers' approximation) on a model that knows something",
        "blocks": "Block length",
        "candidates": "ETE's candidate rule: c_info = 0.2 against confidence-ranked",
        "width": "Width search with the Countdown verifier",
    }
    for name, section_rows in sections.items():
        lines += ["", f"## {titles[name]}", "", *table(section_rows, baselines)]
    lines += ["", f"Measured by `{command}`.", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path(compose(BASE).model.path))
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "countdown_card")
    parser.add_argument("--limit", type=int, default=None, help="problems per tier (default: all)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiers", nargs="+", default=CARD_TIERS, choices=list(TIERS))
    parser.add_argument("--presets", nargs="*", default=None, help="default: every preset")
    parser.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument(
        "--card", type=Path, default=None, help="default: README.md in --runs (--write-committed: beside the model)"
    )
    parser.add_argument(
        "--runs-only",
        action="store_true",
        help="decode (resumable) without writing the card: split a card over processes",
    )
    parser.add_argument(
        "--figure",
        type=Path,
        default=None,
        help="default: countdown_decoders.png in --runs (--write-committed: in docs/)",
    )
    add_flag(parser, "model card (README.md beside the model) and figure in docs/")
    args = parser.parse_args(argv)
    check(parser, args, args.card, args.figure, args.runs / "table.json")
    card_path = args.card or (args.model / "README.md" if args.write_committed else args.runs / "README.md")
    figure = args.figure or (ROOT / "docs" if args.write_committed else args.runs) / "countdown_decoders.png"
    check(parser, args, card_path)
    args.card, args.figure = card_path, figure
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    card_path, figure = args.card, args.figure
    torch.set_num_threads(args.threads)
    presets = args.presets if args.presets is not None else decoder_presets()

    def run_row(section: str, tier: str, label: str, preset: str, overrides: list[str]) -> dict:
        return measure(
            args.runs / section / tier / label,
            tier,
            label,
            preset,
            overrides,
            BASE,
            args.limit,
            args.batch_size,
            strict_accuracy,
        )

    rows = [
        run_row("presets", tier, p, p, PRESET_OVERRIDES.get(p, []))
        for tier in args.tiers
        for p in presets
        if p not in WIDTH_PRESETS or tier in WIDTH_TIERS
    ]
    sections = {}
    for name in args.sections:
        tiers, specs = SECTIONS[name]
        sections[name] = [
            run_row(name, tier, *parse_variant(spec)) for tier in tiers if tier in args.tiers for spec in specs
        ]
    if args.runs_only:
        return
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / "table.json").write_text(json.dumps({"presets": rows, **sections}, indent=2) + "\n")
    plot_accuracy_vs_steps(
        rows, args.tiers, "Shipped Countdown model: accuracy vs steps per decoder", "problem", figure
    )
    command = (
        "bash experiments/countdown_claims.sh"
        if not args.limit
        else f"python experiments/countdown_model_card.py --limit {args.limit}"
    )
    write_card(card_path, card(rows, sections, args, command))
    print(f"wrote {card_path}, {figure} and {args.runs / 'table.json'}")
    for r in rows + [r for s in sections.values() for r in s]:
        print(
            f"{r['tier']:7} {r['label']:26} solved {100 * r['accuracy']:5.1f} %  steps {r['mean_steps']:5.1f}  rows {r['mean_row_forwards']:6.1f}"
        )


if __name__ == "__main__":
    main()
