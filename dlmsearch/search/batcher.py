"""The one continuous batcher: what the CLI's runner and the server share.

Units (a run's item, a server's request with its choices) wait in a queue; between steps the
batcher admits the next ones that its :class:`Admission` allows into the
:class:`~dlmsearch.search.session.DecodeSession` of their lane (one per lane, plus one per unit
that must decode alone), steps every session once, and hands back the results. Its progress
bound is the session's: a sample past the rounds any sample can need fails its step
(:meth:`~dlmsearch.search.decode.state.DecodeState.check_rounds`), so no session steps forever. A
failed step or a refused admission goes to the :class:`Failures` policy: a shared session's
units start again each alone, a unit that failed alone moves to its fallback lane where it has
one, and otherwise gets its last answer (a run's error record, a server's error). Because each
sample decodes exactly as it would alone (the session's guarantee), none of this changes what
a sample returns. The callers keep only their own I/O: records and resume, HTTP and streaming.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Generic, Protocol, TypeVar

import attrs

from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.session import DecodeSession

# A unit joins a running decode only while the decode's prompt columns differ from its own
# prompts' by at most this share of its canvas: a decode's canvas keeps the width of the longest
# prompt admitted into it, so a much shorter prompt would carry that padding through every forward.
# One that does not fit waits (first come, first served) until that decode has drained.
PADDING_SLACK = 0.25

SessionKey = tuple[Hashable, int]  # (the unit's lane, 0 shared or a unit's own serial)


class Unit(Protocol):
    """What the batcher admits: samples that join one session together and leave it one by one."""

    solo: bool  # decodes in a session of its own (after a shared step failed)
    session: SessionKey | None  # the session it was last placed in (set by the batcher)

    @property
    def lane_key(self) -> Hashable:
        """The lane whose shared session it joins (units of one lane decode in one forward)."""

    @property
    def samples(self) -> int:
        """Samples it decodes now (those not yet answered)."""

    @property
    def rows(self) -> int:
        """Rows those samples hold in a step."""

    def requests(self) -> list[DecodeRequest]:
        """The requests of the samples it decodes now."""


U = TypeVar("U", bound=Unit)


@attrs.frozen
class Admission:
    """Which waiting unit may join what decodes: at most ``batch_size`` samples and ``max_rows``
    rows in all (None: no bound), and a canvas padded by at most ``padding_slack`` of the unit's
    own (None: any). A unit is always admitted when nothing else decodes, so every unit runs."""

    batch_size: int | None = None
    max_rows: int | None = None
    padding_slack: float | None = PADDING_SLACK

    def allows(self, unit: Unit, samples: int, rows: int, width: int | None) -> bool:
        """Whether ``unit`` may join while ``samples`` samples on ``rows`` rows decode (those taken
        already included), into a decode whose prompt columns are ``width`` (None: a new one)."""
        if samples == 0:
            return True
        if self.batch_size is not None and samples + unit.samples > self.batch_size:
            return False
        if self.max_rows is not None and rows + unit.rows > self.max_rows:
            return False
        return width is None or self.padding_slack is None or self._fits(unit, width)

    def _fits(self, unit: Unit, width: int) -> bool:
        return all(
            abs(width - len(r.prompt)) <= self.padding_slack * (len(r.prompt) + len(r.generation))  # type: ignore[operator]
            for r in unit.requests()
        )


@attrs.frozen
class Failures(Generic[U]):
    """What a failed step or a refused admission does to its units (the policy each caller plugs in).

    ``give_up(unit, error, refused)`` gives a unit its last answer; ``fallback(unit, error)`` moves
    a unit that failed alone to its fallback lane and says whether it did (False: none, or it was
    there already). ``refusal_is_final``: a refused admission is given up at once (a server's 400:
    the request itself is at fault), not retried alone. Errors of a ``fatal`` type are raised
    (a tensor-parallel group whose collectives no longer pair cannot decode anything more)."""

    give_up: Callable[[U, Exception, bool], None]
    fallback: Callable[[U, Exception], bool] = lambda unit, error: False
    refusal_is_final: bool = False
    fatal: tuple[type[Exception], ...] = ()


@attrs.define(eq=False)
class Batcher(Generic[U]):
    """The waiting units, the running ones, their sessions, and the step that advances them all.

    ``open`` makes the session a unit's lane decodes in; ``on_admitted`` sees every unit as it
    joins (again); ``lock`` guards ``waiting`` and ``running`` where another thread adds to them."""

    admission: Admission
    failures: Failures[U]
    open: Callable[[U], DecodeSession]
    on_admitted: Callable[[U], None] = lambda unit: None
    lock: AbstractContextManager = attrs.field(factory=nullcontext)
    waiting: collections.deque[U] = attrs.field(factory=collections.deque)
    running: list[U] = attrs.field(factory=list)
    sessions: dict[SessionKey, DecodeSession] = attrs.field(factory=dict)
    owner: dict[int, U] = attrs.field(factory=dict)  # uid -> its unit
    serials: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def take(self) -> list[U]:
        """Move the waiting units that the admission allows, in order, to ``running`` (hold ``lock``)."""
        samples = sum(u.samples for u in self.running)
        rows = sum(u.rows for u in self.running)
        widths: dict[SessionKey, int] = {}
        taken: list[U] = []
        while self.waiting:
            unit = self.waiting[0]
            key = (unit.lane_key, next(self.serials) if unit.solo else 0)
            width = widths.get(key, self.width(key))
            if not self.admission.allows(unit, samples, rows, width):
                break
            self.waiting.popleft()
            unit.session = key
            samples, rows = samples + unit.samples, rows + unit.rows
            widths[key] = max([len(r.prompt) for r in unit.requests()] + ([] if width is None else [width]))
            self.running.append(unit)
            taken.append(unit)
        return taken

    def width(self, key: SessionKey) -> int | None:
        """The prompt columns of the decode behind ``key`` (None: nothing decodes there)."""
        session = self.sessions.get(key)
        return None if session is None or session.state is None else session.state.layout.gen_start

    def admit(self, unit: U) -> None:
        """Join a taken unit's samples to its session; a refusal goes to the failure policy."""
        assert unit.session is not None
        if unit.session not in self.sessions:
            self.sessions[unit.session] = self.open(unit)
        session = self.sessions[unit.session]
        requests = unit.requests()
        for request in requests:
            self.owner[request.uid] = unit
        self.on_admitted(unit)
        try:
            session.admit(requests)
        except self.failures.fatal:
            raise
        except Exception as error:  # noqa: BLE001  what only the request shows: the session is unchanged
            for request in requests:
                self.owner.pop(request.uid, None)
            alone = session.state is None and unit.samples == 1
            self._failed([unit], error, refused=True, alone=alone or unit.solo)
            if session.state is None:
                self.sessions.pop(unit.session, None)

    def step(self, key: SessionKey) -> list[DecodeResult] | None:
        """One round of the session behind ``key``; the results it finished. A failed step ends
        the session and goes to the failure policy (None: nothing is returned for its samples)."""
        session = self.sessions[key]
        if session.state is None:
            del self.sessions[key]
            return []
        try:
            results = session.step()  # past its rounds' bound a sample fails the step (DecodeState.check_rounds)
        except self.failures.fatal:
            raise
        except Exception as error:  # noqa: BLE001  one bad sample must not end the others' decoding
            self.sessions.pop(key, None)
            units = list(dict.fromkeys(self.owner[uid] for uid in session.uids if uid in self.owner))
            samples = len(session.uids)
            session.clear()
            for unit in units:
                for request in unit.requests():
                    self.owner.pop(request.uid, None)
            self._failed(units, error, refused=False, alone=len(units) == 1 and (units[0].solo or samples == 1))
            return None
        if session.state is None:
            self.sessions.pop(key, None)
        return results

    def step_all(self) -> list[tuple[U, DecodeResult]]:
        """Every session one round; each finished sample with its unit (``owner`` forgets it)."""
        return [(self.owner.pop(r.uid), r) for key in list(self.sessions) for r in self.step(key) or []]

    def retire(self, unit: U) -> None:
        """A unit that is done (answered, or given up) leaves ``running``."""
        with self.lock:
            if unit in self.running:
                self.running.remove(unit)

    def evict(self, unit: U) -> None:
        """Take a unit's samples out of every session at once (its client went away)."""
        uids = {uid for uid, owner in self.owner.items() if owner is unit}
        for key, session in list(self.sessions.items()):
            leaving = sorted(uids & set(session.uids))
            if leaving:
                session.evict(leaving)
            if session.state is None:
                del self.sessions[key]
        for uid in uids:
            del self.owner[uid]
        self.retire(unit)

    def _failed(self, units: list[U], error: Exception, refused: bool, alone: bool) -> None:
        """Units whose step failed or whose admission was refused: each alone again where they
        were not (first again, in their order), else to the fallback, else given up."""
        if refused and self.failures.refusal_is_final:
            for unit in units:
                self.evict(unit)
                self.failures.give_up(unit, error, True)
            return
        if alone:
            [unit] = units
            if not self.failures.fallback(unit, error):
                self.evict(unit)
                self.failures.give_up(unit, error, refused)
                return
        with self.lock:
            for unit in units:
                if unit in self.running:
                    self.running.remove(unit)
                unit.solo = True
            self.waiting.extendleft(reversed(units))
