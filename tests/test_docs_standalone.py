"""The README and docs/ stand alone: a reader of the repository or of the wheel has nothing else.

Nothing in README.md or docs/*.md points outside the repository except public URLs: no mention
of a sibling ``shared/`` folder or of ``algorithms.md`` (a reference kept beside the repository,
not in it), no relative link that leaves the repository or names a file it does not have, and no
repository path written in backticks (``dlmsearch/...``, ``docs/...``) that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTSIDE = re.compile(r"shared/|algorithms\.md", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPOSITORY_PATH = re.compile(r"^(dlmsearch|docs|experiments|scripts|tests)/[\w./-]*$")


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def outside_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_no_mention_of_files_outside_the_repository(page: Path) -> None:
    hits = [
        f"{name(page)}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, (
        "these lines point to files a reader of the repository does not have (write what they need into docs/):\n"
        + "\n".join(hits)
    )


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_relative_links_stay_in_the_repository_and_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (public), or an anchor on the same page
        resolved = (page.parent / target.partition("#")[0]).resolve()
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
    assert not broken, f"{name(page)} links to:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_repository_paths_in_backticks_exist(page: Path) -> None:
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", outside_fences(page.read_text()))
    missing = [span for span in spans if REPOSITORY_PATH.match(span) and not (ROOT / span).exists()]
    assert not missing, f"{name(page)} names paths the repository does not have: {missing}"


def test_the_checks_catch_what_they_should(tmp_path: Path) -> None:
    """The patterns match the mistakes they exist for (a check that matches nothing passes anything)."""
    assert OUTSIDE.search("see `../shared/reference/algorithms.md`")
    assert OUTSIDE.search("`algorithms.md`'s special cases")
    assert not OUTSIDE.search("the shared exact prefix")
    assert LINK.findall("[the map](architecture.md#layers) and ![a figure](../docs/x.png)") == [
        "architecture.md#layers",
        "../docs/x.png",
    ]
    assert REPOSITORY_PATH.match("dlmsearch/conf/decoder/adalook.yaml")
    assert not REPOSITORY_PATH.match("outputs/<date>/<time>/")
