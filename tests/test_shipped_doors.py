"""Every shipped model answers the way its card and ``docs/serving.md`` say, through every door (issue 51, item 7).

The Countdown models were trained on one prompt (one chat turn, ``Make {target} from {numbers}.``, the numbers
separated by ", "). Each card and the serving page show, for each of them, the server command, one
``/v1/chat/completions`` request and one ``/v1/completions`` request (the templated text itself), each ``curl``
line followed by ``# choices[0]....: ANSWER``. The requests are read from that text, so that the pages cannot drift
from what is tested: each model's server is started as its card says (loopback, an ephemeral port), every documented
request for it is sent as written, and the answer must be the documented one and one the Countdown judge accepts.
The Sudoku model is not served: the server refuses it in one line naming what decodes it, and its card's Python
block prints what the card says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from serving import running_server

from dlmsearch.tasks.arithmetic import extract_equation
from dlmsearch.tasks.countdown import check_equation
from dlmsearch.tasks.countdown_problems import CountdownProblem

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "dlmsearch" / "data"
SERVING = ROOT / "docs" / "serving.md"
CARDS = {  # served name -> the directory its card is in
    "countdown": DATA / "countdown_model",
    "countdown_block": DATA / "countdown_block_model",
    "countdown_uniform": DATA / "countdown_uniform_model",
}
SUDOKU_CARD = DATA / "sudoku_model" / "README.md"
PUZZLE = "408009060000607009905318002001090830000130090009580010600070401807020000024001008"  # easy tier, first
CURL = re.compile(
    r"^(?:\$ )?curl -s 127\.0\.0\.1:8000(?P<path>/v1/(?:chat/)?completions) -d '(?P<body>[^']*)'"
    r"\s+# choices\[0\]\.(?P<field>message\.content|text): (?P<answer>\S+)$"
)
PROBLEM = re.compile(r"Make (\d+) from (\d+(?:, \d+)*)\.")


@attrs.frozen
class Door:
    """One documented request: where it is written, its endpoint and body, and the answer the page gives."""

    source: str
    path: str
    body: dict
    answer: str

    @property
    def chat(self) -> bool:
        return self.path == "/v1/chat/completions"

    def problem(self) -> CountdownProblem:
        text = self.body["messages"][-1]["content"] if self.chat else self.body["prompt"]
        found = PROBLEM.search(text)
        assert found, f"{self.source}: no Countdown problem in {text!r}"
        return CountdownProblem(numbers=tuple(int(n) for n in found.group(2).split(", ")), target=int(found.group(1)))


def fences(page: Path, languages: tuple[str, ...]) -> list[tuple[int, str]]:
    """``(line, body)`` of each fenced block of ``page`` in one of ``languages``."""
    text = page.read_text()
    return [
        (text[: m.start()].count("\n") + 2, m.group(2))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
        if m.group(1) in languages
    ]


def doors(page: Path) -> list[Door]:
    """Every ``curl`` request of ``page`` with its documented answer (bash blocks and console transcripts)."""
    found = []
    for first, body in fences(page, ("bash", "console")):
        for offset, line in enumerate(body.splitlines()):
            if "curl" not in line or "127.0.0.1:8000/v1/" not in line or "completions" not in line:
                continue
            where = f"{page.relative_to(ROOT)}:{first + offset}"
            match = CURL.match(line.strip())
            assert match, f"{where}: a completions request without its answer (`# choices[0]...: ANSWER`): {line}"
            field = "message.content" if match["path"] == "/v1/chat/completions" else "text"
            assert match["field"] == field, f"{where}: the answer of {match['path']} is choices[0].{field}"
            found.append(Door(where, match["path"], json.loads(match["body"]), match["answer"]))
    return found


def server_overrides(page: Path, model: str) -> list[str]:
    """The overrides of ``page``'s first server command for ``model``, in a code block or inline code (``serve.port``
    dropped: 8000 is the default; ``model=countdown`` is the server's default model)."""
    for found in re.finditer(r"python -m dlmsearch\.serve ([^`\n#]*)", page.read_text()):
        words = [w for w in shlex.split(found.group(1)) if not w.startswith("serve.port=")]
        if not any(w.startswith("model=") for w in words):
            words.insert(0, "model=countdown")
        if f"model={model}" in words:
            return words
    raise AssertionError(f"{page.relative_to(ROOT)} has no server command for model={model}")


def model_doors(model: str) -> list[Door]:
    """The documented requests that name ``model``: its card's and the serving page's."""
    return [d for page in (CARDS[model] / "README.md", SERVING) for d in doors(page) if d.body.get("model") == model]


@pytest.mark.parametrize("model", list(CARDS))
def test_the_card_and_the_serving_page_show_both_doors(model: str) -> None:
    """Each page shows a chat and a completions request for each served model; both pages start the same server."""
    for page in (CARDS[model] / "README.md", SERVING):
        mine = [d for d in doors(page) if d.body.get("model") == model]
        assert {d.path for d in mine} == {"/v1/chat/completions", "/v1/completions"}, (page, mine)
    card, page = server_overrides(CARDS[model] / "README.md", model), server_overrides(SERVING, model)
    assert set(card) == {w for w in page if not w.startswith("serve.presets=")}, (card, page)
    template = json.loads((CARDS[model] / "trained_on.json").read_text())["template"]
    card_text = (CARDS[model] / "README.md").read_text()
    assert f"`{template}`" in card_text and f"`{template}`" in SERVING.read_text()


# A server each (10-15 s on one core): the main model's always, the other two with the slow tests
SERVED = [pytest.param(m, marks=() if m == "countdown" else pytest.mark.slow) for m in CARDS]


@pytest.mark.parametrize("model", SERVED)
def test_the_shipped_model_answers_as_documented(model: str, tmp_path: Path) -> None:
    """The card's server, every documented request for the model as written: 200, the documented answer, judged correct."""
    requests = model_doors(model)
    with running_server(server_overrides(CARDS[model] / "README.md", model), cwd=str(tmp_path)) as (_, url, lines):
        for door in requests:
            response = httpx.post(url + door.path, json=door.body, timeout=60)
            assert response.status_code == 200, (door.source, response.text, lines[-10:])
            out = response.json()
            assert out["object"] == ("chat.completion" if door.chat else "text_completion"), (door.source, out)
            assert out["model"] == model and len(out["choices"]) == 1, (door.source, out)
            choice = out["choices"][0]
            text = choice["message"]["content"] if door.chat else choice["text"]
            assert (choice["index"], choice["finish_reason"]) == (0, "stop"), (door.source, out)
            assert out["usage"]["completion_tokens"] <= door.body["max_tokens"], (door.source, out)
            assert text == door.answer, f"{door.source}: the page says {door.answer!r}, the server answered {text!r}"
            check = check_equation(extract_equation(text), door.problem())
            assert check.correct, f"{door.source}: {text!r} is not a solution: {check.error}"


def test_the_server_refuses_the_sudoku_model_naming_what_decodes_it(tmp_path: Path) -> None:
    """One line, exit 2, before the model loads; the command it names decodes a puzzle, and the card shows it."""
    done = subprocess.run(
        [sys.executable, "-m", "dlmsearch.serve", "model=sudoku", "+decoder=adalook", "serve.port=0"]
        + ["serve.host=127.0.0.1", "hydra.run.dir=.", "hydra.output_subdir=null"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model=sudoku is a Sudoku denoiser"), done.stderr
    assert 'Decoder.from_preset("adalook").generate(Model.load("sudoku"), [puzzle])' in lines[0]
    command = re.search(r"python -m dlmsearch \S.*? task\.path=FILE", lines[0])
    assert command, lines[0]
    puzzle = tmp_path / "puzzle.txt"
    puzzle.write_text(PUZZLE + "\n")
    followed = subprocess.run(
        [sys.executable, "-m", *shlex.split(command.group(0).replace("FILE", str(puzzle)))[2:]]
        + [f"hydra.run.dir={tmp_path / 'run'}", f"out_dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert followed.returncode == 0 and "(solved)" in followed.stdout, (
        followed.stdout[-2000:],
        followed.stderr[-2000:],
    )
    card = SUDOKU_CARD.read_text()
    assert (
        f"printf '{PUZZLE}\\n' > puzzle.txt" in card
        and "python -m dlmsearch +decoder=adalook task.path=puzzle.txt" in card
    )


def test_the_sudoku_card_prints_what_it_says(tmp_path: Path) -> None:
    """The card's Python block, run as written (a script of its own), prints the line in its last comment."""
    [(_, block)] = fences(SUDOKU_CARD, ("python",))
    expected = block.strip().splitlines()[-1].removeprefix("# ")
    script = tmp_path / "card_example.py"
    script.write_text(block)
    printed = subprocess.run(
        [sys.executable, str(script)], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert printed.stdout.strip() == expected
