"""Every preset decodes what the committed record says (tests/behaviour_record.py)."""

from __future__ import annotations

import json

import pytest

from behaviour_record import RECORD, record


@pytest.mark.slow
def test_every_preset_decodes_as_recorded() -> None:
    expected = json.loads(RECORD.read_text())
    found = record()
    assert sorted(found) == sorted(expected), "presets were added or removed: write the record again (tests/behaviour_record.py --write)"
    changed = [key for key in expected if found[key] != expected[key]]
    assert not changed, f"decoding changed for {len(changed)} entries, e.g. {changed[:5]}"
