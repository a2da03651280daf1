"""Who decides a decode's token temperature: one declared owner per decode plan.

A commit rule that samples at its own temperature (uniform noise's schedule), a population's
diversity that samples its particles at its own (``TokenTemperature``), or else the settings
layered over each other (``engine.temperature``, the checkpoint's ``generation_config.json``,
the decoder's ``sampling.temperature``; a served request's own). The plan names the owner
once, refuses a temperature set for another one (it would be ignored), and the run's summary
records what was used and where it came from.
"""

from __future__ import annotations

from typing import Any

import attrs

COMMIT_RULE = "commit rule"
DIVERSITY = "diversity"
SETTINGS = "settings"  # engine.temperature, else the checkpoint's, else the decoder's (a request's own over them)


@attrs.frozen
class TemperatureOwner:
    """The one owner of the token temperature: what kind it is, what it says (for messages and the
    summary), the temperature it samples at (a float where every row samples at one, else how it
    varies: ``"0.8→0.4"``) and the setting to change instead of one it would ignore."""

    kind: str  # COMMIT_RULE, DIVERSITY or SETTINGS
    source: str  # e.g. "commit rule UniformNoiseSteps (schedule 0.8→0.4 over each canvas's steps)"
    value: float | str
    instead: str = ""  # e.g. "set decoder.commit.t_max and decoder.commit.t_min instead"

    @property
    def takes_settings(self) -> bool:
        """Whether a temperature set by the user (engine, decoder, request) is the one used."""
        return self.kind == SETTINGS

    def as_dict(self) -> dict[str, Any]:
        """What a run's summary records: the temperature used and where it came from."""
        return {"value": self.value, "owner": self.source}
