"""What the dashboard knows beyond a status snapshot, as plain data; no widgets here.

Observers in this module run on the controller's I/O thread, so each does a
dictionary write or a deque append under a lock and returns: the dashboard's
own thread turns that into widget updates (see :class:`Throttle`).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from .._controller._events import (
    CallFinished,
    Event,
    Heartbeat,
    Output,
    RankFailed,
    RankState,
    RankStateChanged,
)
from .._model._failure_fold import differing, failure_key, fold_traceback

MAX_FAILURES = 200  # kept per mesh; older ones are dropped (the count says how many)


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """A rank that raised or died: what the failure panel lists."""

    rank: int
    cause: str  # "ValueError: boom" or "was killed by signal SIGKILL"
    traceback: str
    returncode: int | None  # exit code or -signal, when the process died
    label: str  # the call or cell it was running ("" if none or unknown)
    at: float  # wall clock

    @classmethod
    def from_event(cls, event: RankFailed) -> FailureRecord:
        return cls(
            event.rank, event.cause, event.traceback, event.returncode, event.label, event.at
        )

    @property
    def died(self) -> bool:
        return self.returncode is not None

    def when(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.at))


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """Identical failures (same cause, traceback and call) of a set of ranks."""

    ranks: tuple[int, ...]  # sorted
    record: FailureRecord  # the newest of them: its cause, traceback, label and time
    count: int  # failures in the group (a rank that failed twice counts twice)

    @property
    def at(self) -> float:
        return self.record.at


def fold_failures(records: Iterable[FailureRecord]) -> list[FailureGroup]:
    """Failures folded by rank set, newest group first: those of one call that raised
    the same exception type at the same code location are one group (their
    messages folded by rank in the group's cause and traceback, as the cell's
    error shows them); deaths fold when their cause is the same."""
    groups: dict[tuple[object, ...], list[FailureRecord]] = {}
    for record in records:
        key = (*_where(record), record.label, record.returncode)
        groups.setdefault(key, []).append(record)
    folded = [
        FailureGroup(tuple(sorted({r.rank for r in members})), _one(members), len(members))
        for members in groups.values()
    ]
    folded.sort(key=lambda group: group.at, reverse=True)
    return folded


def _where(record: FailureRecord) -> tuple[str, str]:
    if record.died or not record.traceback:
        return record.cause, record.traceback
    return failure_key(record.cause.partition(":")[0], record.traceback)


def _one(members: list[FailureRecord]) -> FailureRecord:
    """The newest of ``members``, with every member's message folded in when they differ."""
    newest = members[-1]
    if newest.died or not newest.traceback:
        return newest
    type_name = newest.cause.partition(":")[0]
    messages = [(r.rank, r.cause.partition(": ")[2]) for r in sorted(members, key=_rank)]
    count = differing(messages)
    if count <= 1:
        return newest
    traceback = fold_traceback(min(members, key=_rank).traceback, type_name, messages)
    cause = f"{newest.cause} ({count} different messages, by rank in the traceback)"
    return dataclasses.replace(newest, cause=cause, traceback=traceback)


def _rank(record: FailureRecord) -> int:
    return record.rank


def is_interrupt(event: RankFailed) -> bool:
    """A KeyboardInterrupt is a stop someone asked for (Ctrl-C, a timeout,
    ``--fail-fast``), not a failure of the rank."""
    return event.returncode is None and event.cause.startswith("KeyboardInterrupt")


class FailureLog:
    """Every RankFailed of a mesh (the newest ``MAX_FAILURES``), interrupts left out;
    an event observer.

    A notebook mesh keeps one from its start, so a dashboard opened after a
    crash still lists it.
    """

    def __init__(self, maxlen: int = MAX_FAILURES) -> None:
        self._records: deque[FailureRecord] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.total = 0  # including those dropped from the deque

    def __call__(self, event: Event) -> None:
        if isinstance(event, RankFailed) and not is_interrupt(event):
            with self._lock:
                self._records.append(FailureRecord.from_event(event))
                self.total += 1

    def records(self) -> tuple[FailureRecord, ...]:
        """The failures kept, oldest first."""
        with self._lock:
            return tuple(self._records)

    def groups(self) -> list[FailureGroup]:
        """The failures kept, folded by rank set, newest first."""
        return fold_failures(self.records())

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self.total = 0


@dataclass(frozen=True, slots=True)
class Progress:
    """A rank's progress bar (tqdm or alike), parsed from its last ``\\r`` update."""

    text: str  # the bar's line, trimmed
    fraction: float | None  # 0..1 when the line says so ("40%" or "4/10")


_PERCENT = re.compile(r"(\d{1,3})%")
_COUNT = re.compile(r"(\d+)/(\d+)")
_MAX_PROGRESS_CHARS = 80


def parse_progress(line: str) -> Progress:
    """``" 40%|████      | 4/10 [00:01<00:02]"`` -> Progress(fraction=0.4)."""
    text = line.strip()
    if len(text) > _MAX_PROGRESS_CHARS:
        text = text[: _MAX_PROGRESS_CHARS - 1] + "…"
    fraction = None
    count = _COUNT.search(line)
    percent = _PERCENT.search(line)
    if count and int(count.group(2)) > 0:
        fraction = min(1.0, int(count.group(1)) / int(count.group(2)))
    elif percent:
        fraction = min(1.0, int(percent.group(1)) / 100)
    return Progress(text, fraction)


class DashboardFeed:
    """The dashboard's observer: collects progress and marks what needs redrawing.

    ``urgent`` events (a state change, a failure, the end of a call) are drawn
    within one throttle interval; heartbeats only make the next periodic
    refresh worth doing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress: dict[int, Progress] = {}
        self._urgent = False
        self._dirty = False
        self.wake = threading.Event()  # set on urgent events, for the update thread
        self.events_seen = 0

    def __call__(self, event: Event) -> None:
        self.events_seen += 1
        if isinstance(event, Heartbeat):
            self._dirty = True
            return
        with self._lock:
            if isinstance(event, Output):
                if event.end != "\r":
                    return  # ordinary lines are in the core's per-rank tail already
                self._progress[event.rank] = parse_progress(event.line)
                self._dirty = True
                return
            if isinstance(event, RankStateChanged) and event.state is RankState.STARTING:
                self._progress.pop(event.rank, None)
            elif isinstance(event, CallFinished):
                for rank in event.ranks:
                    self._progress.pop(rank, None)
            self._urgent = self._dirty = True
        self.wake.set()

    def take(self) -> tuple[bool, bool, dict[int, Progress]]:
        """``(urgent, dirty, progress)`` since the last take; clears the flags."""
        with self._lock:
            urgent, dirty = self._urgent, self._dirty
            self._urgent = self._dirty = False
            self.wake.clear()
            return urgent, dirty, dict(self._progress)


class Throttle:
    """When to redraw: urgent changes at most every ``min_interval`` s, anything
    else every ``refresh`` s (heartbeat ages move even when nothing happens).

    Pure: the caller passes the clock, so tests need no sleeps.
    """

    def __init__(self, min_interval: float = 0.1, refresh: float = 1.0) -> None:
        self.min_interval, self.refresh = min_interval, refresh
        self.last: float | None = None

    def due(self, now: float, urgent: bool) -> bool:
        if self.last is None:
            return True
        elapsed = now - self.last
        return elapsed >= self.refresh or (urgent and elapsed >= self.min_interval)

    def next_wait(self, now: float, urgent: bool) -> float:
        """Seconds until a redraw would be due (0 if it is due now)."""
        if self.last is None:
            return 0.0
        target = self.min_interval if urgent else self.refresh
        return max(0.0, self.last + target - now)

    def drew(self, now: float) -> None:
        self.last = now
