"""Where the files shipped inside the package live (``dlmsearch/data/``), found through
importlib.resources so that an installed wheel finds them as a checkout does."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def package_data(name: str) -> Path:
    """``dlmsearch/data/NAME``: a shipped data set or model directory (e.g. model=countdown's weights)."""
    return Path(str(resources.files("dlmsearch") / "data" / name))
