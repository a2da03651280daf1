"""Every command block of README.md and docs/*.md runs as written (issue 35, item 7).

The fenced ``bash`` and ``python`` blocks are extracted, each logical line (backslash
continuations joined, trailing comments dropped) is run in a copy of the repository's tracked
files, so that nothing a command writes reaches the checkout. Commands are shortened only by
appending settings a later override wins with (``task.limit``, the output directories), and the
example model paths are replaced by local models: a tiny random LLaDA written in LLaDA's format
for ``/models/LLaDA-8B-*`` and ``DIR``, a tiny Dream for ``/models/Dream-*`` (built with the
upstream code, skipped where ``../shared`` is absent). A command that cannot run here is listed
in :data:`EXCLUDED` by a fragment of its text, with the reason; every other command must exit as
:data:`EXPECTED_EXIT` says (0 unless named).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = ("bash", "sh", "shell")
TIMEOUT_S = 600

# Fragment of a command -> why it is not run here. Every entry must match a documented command.
EXCLUDED = {
    "bash scripts/test.sh": "the test command itself (CI's .ci/run): it runs this test",
    "bash scripts/demo.sh": "sets up .venv and decodes all 256 puzzles; its job, python -m dlmsearch +decoder=adalook, runs shortened from the same block's neighbours and in scripts/check_wheel.sh",
    "+experiment=ablate_gate task.tier=hard": "114 decodes of the hard tier (hours on CPU); the block's smaller grid runs",
    "+experiment=budget_curve task.tier=hard": "45 runs of every preset on the hard tier (hours on CPU); the smaller ablate_gate grid runs",
    "+experiment=ablate_gate model=llada": "an 8B-scale GPU sweep (6 arms x 256 GSM8K problems); the same grid runs on Sudoku above",
    "+experiment=budget_curve model=dream": "a 7B-scale GPU sweep (45 runs x 256 GSM8K problems); the shape is the Sudoku sweep's",
    "+decoder=dream model=dream model.path=/models/Dream-v0-Instruct-7B task=gsm8k": "Dream's 152k vocabulary over 256 steps: over 10 minutes on CPU even for a tiny Dream; the Dream lines on Countdown run",
    "+decoder=dream model=dream model.path=DIR task=gsm8k": "Dream's 152k vocabulary over 256 steps: over 10 minutes on CPU even for a tiny Dream; the Dream lines on Countdown run",
    "torchrun --nproc_per_node=8": "8 processes, one per GPU; two CPU processes run the same path in tests/test_production.py",
    "model.path=/models/LLaDA-8B-Instruct model.tensor_parallel=2": "the same 4-process layout runs on the shipped Countdown model in the block's last line (a stand-in LLaDA's GSM8K canvas costs a minute on 2 cores)",
    "hydra/launcher=slurm_gpu": "needs a SLURM cluster and hydra-submitit-launcher (the cluster extra)",
    "model.path=/models/SDAR-4B-Chat": "needs SDAR-4B's weights: GSM8K prompts do not fit the shipped block model's 128 positions (tests/test_block_cli.py runs a tiny SDAR)",
    "model.path=/models/diffusiongemma-26B-A4B-it": "needs DiffusionGemma's weights and tokenizer; tests/test_diffusion_gemma_parity.py runs the loop on tiny DiffusionGemma checkpoints and tests/test_diffusion_gemma_cli.py the CLI on a Countdown-format one",
    "model.path=/models/LLaDA2.0-mini-preview": "needs LLaDA2.0-mini's weights: GSM8K prompts do not fit the shipped block model's 128 positions (tests/test_block_diffusion.py covers LLaDA2)",
    "ship_model.py --train-dir": "needs the 88-minute training run of the line above",
    "train_sudoku.py budget_minutes=88": "trains for 88 minutes (tests/test_training.py trains a few steps)",
    "train_countdown.py budget_minutes=88": "trains for 88 minutes (tests/test_training.py trains a few steps)",
    "train_countdown_block.py budget_minutes=88": "trains for 88 minutes (tests/test_block_training.py trains a few steps)",
    "block_model_card.py": "decodes every preset on three tiers (about 20 minutes on CPU)",
    "sudoku_model_card.py": "decodes every preset on both tiers (about 15 minutes on CPU)",
    "countdown_claims.sh": "decodes every preset on three tiers (about 20 minutes on CPU)",
    "train_countdown_mix.sh": "trains four models for about 2.5 CPU hours (tests/test_mix_training.py covers the mix, init_from and the ablation)",
    "plot_mix_curves.py": "draws the four training runs of the line above (runs/mix/, never committed)",
    "plot_tree_trace.py": "draws the trace the block's first line writes (that line runs, its outputs moved to a scratch directory)",
    "paradigm_card.py": "decodes every preset on four models and five tiers (about 35 minutes on 2 cores), from the runs of the block's first line",
}

# Commands whose documented outcome is not exit 0.
EXPECTED_EXIT: dict[str, int] = {}


@attrs.frozen
class DocCommand:
    """One logical line of a fenced block: where it is documented and its text."""

    source: str  # file:line
    language: str
    text: str

    @property
    def excluded(self) -> str | None:
        return next((reason for fragment, reason in EXCLUDED.items() if fragment in self.text), None)


@attrs.frozen
class DocBlock:
    source: str
    language: str
    commands: tuple[DocCommand, ...]


def _logical_lines(body: str, first_line: int) -> Iterator[tuple[int, str]]:
    """Lines with backslash continuations joined and comments dropped (a ``#`` after whitespace, outside quotes)."""
    pending, start = "", first_line
    for offset, raw in enumerate(body.splitlines()):
        if not pending:
            start = first_line + offset
        line = _drop_comment(raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            yield start, " ".join(text.split()) if "'" not in text and '"' not in text else text


def _drop_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def documented_blocks() -> list[DocBlock]:
    blocks = []
    for name in DOCUMENTS:
        text = (ROOT / name).read_text()
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            language = match.group(1) or "bash"
            line = text[: match.start()].count("\n") + 1
            if language in SHELL_LANGUAGES:
                if not _looks_like_commands(match.group(2)):
                    continue
                commands = tuple(
                    DocCommand(f"{name}:{n}", "bash", t) for n, t in _logical_lines(match.group(2), line + 1)
                )
            elif language == "python":
                commands = (DocCommand(f"{name}:{line + 1}", "python", match.group(2)),)
            else:
                continue
            blocks.append(DocBlock(f"{name}:{line}", "bash" if language != "python" else "python", commands))
    return blocks


def _looks_like_commands(body: str) -> bool:
    """An untagged fence is a command block when its lines start with a command (not a file tree)."""
    first = next((ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
    return bool(re.match(r"(python|bash|torchrun|curl|cd|pip)\b", first))


BLOCKS = documented_blocks()


def test_every_exclusion_names_a_documented_command() -> None:
    texts = [c.text for b in BLOCKS for c in b.commands]
    stale = [fragment for fragment in EXCLUDED if not any(fragment in t for t in texts)]
    assert not stale, f"EXCLUDED entries that match no documented command: {stale}"


def test_the_blocks_are_found() -> None:
    sources = {b.source.split(":")[0] for b in BLOCKS}
    assert {"README.md", "docs/serving.md", "docs/text_models.md", "docs/production.md"} <= sources


# ---------------------------------------------------------------- the places commands run in


@pytest.fixture(scope="session")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tracked files: commands that write beside themselves write there."""
    copy = tmp_path_factory.mktemp("checkout")
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    )
    for name in filter(None, tracked):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | None]:
    """Local stand-ins for the documented model paths."""
    from serve_load import random_llada  # experiments/ is on sys.path (conftest)

    root = tmp_path_factory.mktemp("doc_models")
    llada = random_llada(root / "llada")
    dream = None
    try:
        from tiny_checkpoints import build_dream, upstream_missing_reason
        from tiny_tokenizer import write_tokenizer

        if not upstream_missing_reason():
            dream = root / "dream"
            build_dream(dream)
            write_tokenizer(dream, "dream")
    except ImportError:
        dream = None
    return {"llada": llada, "dream": dream}


@attrs.define
class Shell:
    """Runs documented commands in the copy, with the stand-ins substituted and outputs kept in ``scratch``."""

    checkout: Path
    scratch: Path
    models: dict[str, Path | None]
    runs: int = 0
    last_sweep: Path | None = None
    port: int | None = None

    def substituted(self, command: DocCommand) -> str:
        text = command.text
        dream = self.models["dream"]
        if "Dream" in text or "model=dream" in text:
            if dream is None:
                pytest.skip(f"{command.source}: the tiny Dream checkpoint needs the upstream code (../shared absent)")
            text = re.sub(r"/models/Dream-[\w.-]+", str(dream), text)
            text = text.replace("model.path=DIR", f"model.path={dream}")
        llada = str(self.models["llada"])
        text = re.sub(r"/models/LLaDA-8B-[\w.-]+", llada, text)
        text = text.replace("model.path=DIR", f"model.path={llada}").replace("model.path=...", f"model.path={llada}")
        text = text.replace("task.path=my.txt", f"task.path={self._puzzles()}")
        text = text.replace("task.path=prompts.jsonl", f"task.path={self._prompts()}")
        if self.last_sweep is not None:
            text = text.replace("multirun/<experiment>/<time>", str(self.last_sweep))
        if self.port is not None:
            text = text.replace("8000", str(self.port))
        return text

    def shortened(self, text: str) -> str:
        """A decode of one item, its outputs in the scratch directory (later overrides win)."""
        if (
            not re.match(r"(python -m dlmsearch|torchrun .*-m dlmsearch)( |$)", text)
            or text.strip() == "python -m dlmsearch"
        ):
            return text
        self.runs += 1
        if re.search(r"(^| )(-m|--multirun)( |$)", text.split("dlmsearch", 1)[1]):
            self.last_sweep = self.scratch / f"sweep{self.runs}"
            return f"{text} task.limit=1 hydra.sweep.dir={self.last_sweep}"
        out = self.scratch / f"run{self.runs}"
        return f"{text} task.limit=1 out_dir={out} hydra.run.dir={out}"

    def _puzzles(self) -> Path:
        path = self.scratch / "my.txt"
        path.write_text("408009060000607009905318002001090830000130090009580010600070401807020000024001008\n")
        return path

    def _prompts(self) -> Path:
        path = self.scratch / "prompts.jsonl"
        path.write_text('{"prompt": "Make 24 from 3 4 6 2."}\n{"prompt": "What is 7 * 8?"}\n')
        return path

    def environment(self) -> dict[str, str]:
        """One thread (as every test process); the venv's tools first; the copy's package before the editable install's, so that what a
        script writes beside the package lands in the copy."""
        return {
            **os.environ,
            "HYDRA_FULL_ERROR": "0",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(self.checkout),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        }

    def run(self, command: DocCommand) -> None:
        if command.language == "python":
            argv = [sys.executable, "-c", self.substituted(command)]
        else:
            argv = ["bash", "-c", self.shortened(self.substituted(command))]
        done = subprocess.run(
            argv,
            cwd=self.checkout,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        expected = EXPECTED_EXIT.get(command.text, 0)
        assert done.returncode == expected, (
            f"{command.source}: `{command.text}` exited {done.returncode} (documented: {expected})\n"
            f"ran: {argv[-1]}\nstdout tail: {done.stdout[-1500:]}\nstderr tail: {done.stderr[-3000:]}"
        )


@pytest.fixture
def shell(checkout: Path, models: dict[str, Path | None], tmp_path: Path) -> Shell:
    return Shell(checkout, tmp_path, models)


def _is_server(command: DocCommand) -> bool:
    return command.text.startswith("python -m dlmsearch.serve")


def _needs_server(block: DocBlock) -> bool:
    return block.source.startswith("docs/serving.md") and not any(_is_server(c) for c in block.commands)


RUNNABLE = [(b, c) for b in BLOCKS if not _needs_server(b) for c in b.commands if not _is_server(c)]


@pytest.mark.parametrize(("block", "command"), RUNNABLE, ids=[c.source for _, c in RUNNABLE])
def test_documented_command_runs(block: DocBlock, command: DocCommand, shell: Shell) -> None:
    if command.excluded is not None:
        pytest.skip(f"{command.source}: {command.excluded}")
    if "<experiment>/<time>" in command.text:  # collects the sweep the line before it made
        before = [c for c in block.commands[: block.commands.index(command)] if c.excluded is None]
        shell.run(before[-1])
    shell.run(command)


def test_serving_page_runs(shell: Shell) -> None:
    """The serving page's server commands start and answer; its curl and client blocks run against the first."""
    blocks = [b for b in BLOCKS if b.source.startswith("docs/serving.md")]
    servers = [c for b in blocks for c in b.commands if _is_server(c)]
    clients = [c for b in blocks for c in b.commands if not _is_server(c) and c.excluded is None]
    assert servers and clients
    for index, server in enumerate(servers):
        shell.port = free_port()
        with _running(shell, server):
            if index == 0:
                for client in clients:
                    shell.run(client)


class _running:
    """A documented server command, up until ``/health`` answers, then SIGTERM."""

    def __init__(self, shell: Shell, command: DocCommand) -> None:
        self.shell, self.command = shell, command

    def __enter__(self) -> None:
        import urllib.request

        text = self.shell.substituted(self.command)
        if "serve.port=" not in text:
            text += f" serve.port={self.shell.port}"
        text += " serve.host=127.0.0.1"
        env = self.shell.environment()
        self.log = self.shell.scratch / f"server{self.shell.port}.log"
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {text}"],
            cwd=self.shell.checkout,
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"{self.command.source}: `{self.command.text}` exited {self.process.returncode}: {self.log.read_text()[-3000:]}"
                )
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.shell.port}/health", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(
            f"{self.command.source}: the server did not answer /health within 120 s: {self.log.read_text()[-3000:]}"
        )

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# ---------------------------------------------------------------- the README as the front door (issue 48, item 6)

PAGES = [*DOCUMENTS, "experiments/RESULTS.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(
        r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE), re.MULTILINE
    )
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_readme_is_a_front_door() -> None:
    """At most 200 lines, at most one table per section, and each table's section names the command that measured it."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines (at most 200)"
    for section in re.split(r"^#+ ", text, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0]
        tables = re.findall(r"^\|---", section, re.MULTILINE)
        figures = [row for row in re.findall(r"^\|.*$", section, re.MULTILINE) if re.search(r"\d %", row)]
        assert len(tables) <= 1, f"README.md section {title!r} has {len(tables)} tables (one at most)"
        if figures:
            assert re.search(r"`(python|bash) [^`]+`", section), (
                f"README.md section {title!r}: figures without their command"
            )


def test_no_page_points_outside_the_repository() -> None:
    offenders = [name for name in PAGES if "../shared" in (ROOT / name).read_text()]
    assert not offenders, f"these pages point to ../shared, which a reader does not have: {offenders}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for name in PAGES:
        page = ROOT / name
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{name}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
