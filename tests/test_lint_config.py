"""The lint configuration is live: every rule pyproject.toml configures (ignored, ignored per file, or
configured through a plugin section) and every code a ``# noqa`` names is selected by name and enabled
by ``ruff check --show-settings``, whatever ruff's own default set is (issue 47, defect 13)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
NOQA = re.compile(r"#\s*noqa:\s*([A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)")
PLUGIN_RULES = {"isort": "I001"}  # a plugin section whose settings only this rule reads


def _lint() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]


def _configured_codes() -> set[str]:
    """Every code the configuration or a noqa comment names."""
    lint = _lint()
    codes = set(lint.get("ignore", []))
    for ignored in lint.get("per-file-ignores", {}).values():
        codes.update(ignored)
    codes.update(rule for section, rule in PLUGIN_RULES.items() if section in lint)
    for folder in ("dlmsearch", "tests", "experiments", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for match in NOQA.finditer(path.read_text(encoding="utf-8")):
                codes.update(code.strip() for code in match.group(1).split(","))
    return codes


def test_every_configured_code_is_selected_by_name() -> None:
    lint = _lint()
    selected = set(lint.get("select", [])) | set(lint.get("extend-select", []))
    missing = sorted(code for code in _configured_codes() if not any(code.startswith(s) for s in selected))
    assert not missing, f"configured or noqa'd but left to ruff's default set: {missing} (add them to extend-select)"


def test_ruff_runs_every_configured_code() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    settings = subprocess.run(
        [ruff, "check", "--show-settings", str(ROOT)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert settings.returncode == 0, settings.stderr
    enabled_block = settings.stdout.split("linter.rules.enabled = [", 1)[1].split("]", 1)[0]
    enabled = set(re.findall(r"\(([A-Z]+[0-9]+)\)", enabled_block))
    ignored = set(_lint().get("ignore", []))
    inert = sorted(code for code in _configured_codes() - ignored if code not in enabled)
    assert not inert, f"ruff check --show-settings does not enable {inert}: their settings and noqa comments are inert"
