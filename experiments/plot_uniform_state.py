"""Draw the state of a uniform-noise decode (DiffusionGemma's loop through dlmsearch) round by round.

One Countdown problem is decoded with ``+decoder=diffusion_gemma`` on a DiffusionGemma-format
checkpoint; after every round (one decoder call) each generation position is in one of the states
of ``docs/architecture.md`` ("The state, generalised"): open (noised: the next step may replace
it), kept this step (its sample; the next step re-decides it), final (a finished canvas's draft)
or filled (after the answer's end). Rows are rounds, columns the generation's positions, each cell
shows its token where it holds one.

    python experiments/plot_uniform_state.py --model dlmsearch/data/countdown_uniform_model   # runs/uniform_state.png
    python experiments/plot_uniform_state.py --model dlmsearch/data/countdown_uniform_model --out docs/uniform_state.png --write-committed
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from outputs import RUNS, add_flag, check

from dlmsearch.config import build, compose_settings
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.tasks.text import load_tokenizer

STATES = ("open (noised)", "kept this step", "final (draft)", "filled after the end")
COLOURS = ("#d9d9d9", "#fdb863", "#5e3c99", "#f7f7f7")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a DiffusionGemma-format checkpoint directory")
    parser.add_argument("--item", type=int, default=0, help="which Countdown problem of the model's tier")
    parser.add_argument("--out", type=Path, default=RUNS / "uniform_state.png")
    add_flag(parser, "figure (an --out under docs/)")
    args = parser.parse_args(argv)
    check(parser, args, args.out)
    return args


def trace(model: Path, item_index: int) -> tuple[list[np.ndarray], list[list[str]], str, str]:
    """Per round: each generation position's state (an index into STATES) and token (its text); the problem and the output."""
    overrides = [
        "model=diffusion_gemma",
        f"model.path={model}",
        "+decoder=diffusion_gemma",
        "task=countdown",
        f"task.limit={item_index + 1}",
    ]
    cfg = compose_settings(overrides)
    adapter = build(cfg, "model")
    task, decoder = build(cfg, "task"), build(cfg, "decoder")
    engine = build(cfg, "engine", adapter=adapter)
    item = task.items()[item_index]
    request = DecodeRequest(uid=item_index, prompt=item.prompt, generation=item.generation)
    states: list[np.ndarray] = []
    tokens: list[list[str]] = []
    gen_length = len(item.generation)
    tokenizer = load_tokenizer(str(model), False)

    def on_round(canvas, source) -> None:
        gen = slice(canvas.tokens.shape[1] - gen_length, None)
        masked, call = canvas.masked[0, gen], canvas.commit_call[0, gen]
        held = bool(canvas.held[0])
        state = torch.where(masked, 0, torch.where(call < 0, 3, 2))
        if held:  # the block being denoised: what is not open was kept this step
            current = torch.zeros(gen_length, dtype=torch.bool)
            current[
                int(canvas.block[0]) * adapter.canvas_length : (int(canvas.block[0]) + 1) * adapter.canvas_length
            ] = True
            state = torch.where(current & ~masked, 1, state)
        states.append(state.numpy())
        ids = canvas.tokens[0, gen].tolist()
        tokens.append(["" if m else _label(tokenizer.decode([i])) for i, m in zip(ids, masked.tolist())])

    result = decoder.decode(engine, [request], task.block_length, on_round=on_round)[0]
    return states, tokens, str(item.question), task.output(item, result.tokens)


def _label(text: str) -> str:
    """A cell's text: special tokens shortened (``<|eot_id|>`` -> ``eot``)."""
    return text[2:-2].split("_")[0][:3] if text.startswith("<|") else text


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    states, tokens, prompt, output = trace(args.model, args.item)
    grid = np.stack(states)
    rounds, columns = grid.shape
    fig, ax = plt.subplots(figsize=(max(6, columns * 0.45), max(3, rounds * 0.32)))
    ax.imshow(grid, cmap=ListedColormap(COLOURS), vmin=0, vmax=len(COLOURS) - 1, aspect="auto")
    for r in range(rounds):
        for c in range(columns):
            if tokens[r][c] and grid[r, c] in (1, 2):
                colour = "white" if grid[r, c] == 2 else "black"
                ax.text(c, r, tokens[r][c], ha="center", va="center", fontsize=7, color=colour)
    ax.set_xlabel("generation position")
    ax.set_ylabel("round (one decoder call)")
    ax.set_title(f"uniform-noise decode, {Path(args.model).name}: output {output!r}", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in COLOURS]
    ax.legend(handles, STATES, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=7, frameon=False)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=150)
    print(f"prompt: {prompt!r}\noutput: {output!r}\nwrote {args.out} ({rounds} rounds)")


if __name__ == "__main__":
    main()
