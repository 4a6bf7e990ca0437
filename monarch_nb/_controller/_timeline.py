"""A per-rank timeline of a mesh's calls and cells: who ran what, when, how it ended.

The controller's call bookkeeping (``_client``) tells a mesh's
:class:`TimelineRecorder` when a call was sent to which ranks, when each rank
answered (and whether with an error) and when the call ended, so the ranks
that never answered (died, cancelled) get an end too. That is an entry
appended to a bounded log per call and per reply, no lock: cheap enough to
stay on for every mesh. The log is read back into spans when asked.

``procs.timeline(minutes=10)`` (``%mesh timeline``) reads it back as a
:class:`Timeline`: its ``spans`` (one per rank and call), ``stragglers()``
(a rank that took more than 1.5x the median of the others on the same call),
a text chart for ``print`` and an SVG chart in a notebook.

Time a rank spent paused in the debugger is not time it was slow: the
recorder logs each pause and resume, and a span's ``active`` seconds leave
them out. A restart logs the ranks it replaced: a dashboard's marks
(:meth:`Timeline.latest_stragglers`) are of the processes running now.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import statistics
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._model._fold import format_ranks

Outcome = Literal["ok", "error", "interrupted", "died", "cancelled", "running"]
# The newest calls are kept: at most this many, and at most this many (call, rank)
# entries (256 ranks x ~200 calls), about 0.5 KB each: a few MB at most.
MAX_CALLS = 5_000
MAX_ENTRIES = 50_000
STRAGGLER_FACTOR = 1.5
STRAGGLER_MIN_GAP_S = 0.1  # a 2 ms call next to a 1 ms one is noise, not a straggler


@dataclass(frozen=True, slots=True)
class Span:
    """One rank's part in one call: from when it was sent to when the rank answered."""

    rank: int
    call_id: int
    label: str  # "<mesh-cell-3>", "Trainer.step", "spawn of Trainer 'trainer'"
    start: float  # wall clock, seconds
    end: float | None  # None while the rank still runs it
    outcome: Outcome
    detail: str = ""  # the error, one line
    paused: float = 0.0  # seconds of it the rank spent stopped in the debugger

    @property
    def seconds(self) -> float:
        """How long it ran (so far, for a running span)."""
        return (self.end if self.end is not None else time.time()) - self.start

    @property
    def active(self) -> float:
        """How long it ran, leaving out the time paused in the debugger."""
        return max(0.0, self.seconds - self.paused)


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank that took much longer than the median rank of the same call."""

    rank: int
    call_id: int
    label: str
    seconds: float  # its active seconds (time paused in the debugger left out)
    median: float  # of every rank of the call that finished
    at: float = 0.0  # wall clock when the call began

    @property
    def ratio(self) -> float:
        return self.seconds / self.median if self.median > 0 else 0.0

    def __str__(self) -> str:
        return (
            f"rank {self.rank} took {self.seconds:.2f} s in {self.label} (call {self.call_id}), "
            f"{self.ratio:.1f}x the median {self.median:.2f} s"
            if self.median > 0
            else f"rank {self.rank} took {self.seconds:.2f} s in {self.label}"
        )


# What the recorder keeps: a log of what happened, appended to without a lock
# (one deque append, atomic under the GIL) and read back into spans only when
# someone asks. A pipelining caller sends and answers thousands of calls a
# second; bookkeeping per call (a lock, a dict per call, evictions) cost it
# more than a tenth of its rate (34,200 against 39,400 calls/s with the
# recorder off, same run). Each entry is a tuple of atoms, which the garbage
# collector stops tracking at the first collection it sees.
_BEGAN, _ANSWERED, _FAILED, _LAST, _ENDED, _PAUSED, _RESUMED, _RESTARTED = range(8)
_RANK_EVENTS = (_PAUSED, _RESUMED, _RESTARTED)


class TimelineRecorder:
    """The calls of one process mesh, newest last (thread-safe).

    Keeps the newest calls: at most ``max_calls`` of them, and at most
    ``max_entries`` (call, rank) entries in all (always the newest call). The
    log behind them holds ``max_events`` entries: a call logs its start, one
    answer per rank and its end.
    """

    def __init__(self, max_calls: int = MAX_CALLS, max_entries: int = MAX_ENTRIES) -> None:
        self.max_calls = max_calls
        self._max_entries = max_entries
        self.max_events = max_entries + 2 * max_calls
        self._log: deque[tuple[Any, ...]] = deque(maxlen=self.max_events)

    def began(self, call_id: int, label: str, ranks: Iterable[int]) -> None:
        self._log.append((_BEGAN, call_id, label, tuple(ranks), time.time()))

    def answered(self, call_id: int, rank: int, error: str | None) -> None:
        """``rank`` replied to ``call_id``: with ``error`` ("Type: message") or a value."""
        if error is None:
            self._log.append((_ANSWERED, call_id, rank, time.time()))
        else:
            self._log.append((_FAILED, call_id, rank, time.time(), *_outcome_of(error)))

    def answered_last(self, call_id: int, rank: int) -> None:
        """``answered(call_id, rank, None)`` then ``ended(call_id, None)``: the reply
        that completed the call, with a value, and every other rank answered."""
        self._log.append((_LAST, call_id, rank, time.time()))

    def ended(self, call_id: int, error: str | None) -> None:
        """The call is over (``error``: "Type: message" if it failed): the ranks that
        never answered end now, as died (a MeshFailure), cancelled or interrupted."""
        if error is not None and error.startswith("MeshFailure"):
            outcome: tuple[Outcome, str] = ("died", error)  # or was stopped under it
        else:
            outcome = _outcome_of(error or "CancelledError: the call ended first")
        self._log.append((_ENDED, call_id, time.time(), *outcome))

    def paused(self, rank: int) -> None:
        """``rank`` stopped in the debugger (its time there is not its calls' time)."""
        self._log.append((_PAUSED, rank, time.time()))

    def resumed(self, rank: int) -> None:
        self._log.append((_RESUMED, rank, time.time()))

    def restarted(self, ranks: Iterable[int]) -> None:
        """``ranks`` got fresh processes: what their old ones did marks them no more."""
        self._log.append((_RESTARTED, tuple(ranks), time.time()))

    def _copy(self) -> list[tuple[Any, ...]]:
        """The log as it is: a copy in one step in C, which appends wait for;
        should another thread ever run meanwhile, the copy notices, and is made again."""
        while True:
            try:
                return list(self._log)
            except RuntimeError:  # "deque mutated during iteration"
                continue

    def _calls(self, events: list[tuple[Any, ...]]) -> dict[int, _Call]:
        """The newest calls within the limits, each with its ranks' ends, from the log."""
        # Where the oldest call kept begins (the newest calls that fit, always
        # one): what comes before it is of calls no longer kept, not read at all.
        first, kept, entries = len(events), 0, 0
        for at in range(len(events) - 1, -1, -1):
            event = events[at]
            if event[0] != _BEGAN:
                continue
            entries += len(event[3])
            if kept and (kept >= self.max_calls or entries > self._max_entries):
                break
            kept, first = kept + 1, at
        calls: dict[int, _Call] = {}
        for event in itertools.islice(events, first, None):
            kind, call_id = event[0], event[1]
            if kind in _RANK_EVENTS:
                continue
            if kind == _BEGAN:
                calls[call_id] = _Call(event[2], event[3], event[4])
                continue
            call = calls.get(call_id)
            if call is None:  # a call begun before those kept
                continue
            if kind == _ANSWERED:
                call.ends.setdefault(event[2], (event[3], "ok", ""))
            elif kind == _FAILED:
                call.ends.setdefault(event[2], (event[3], event[4], event[5]))
            elif not call.finished:  # _LAST or _ENDED: the first end of the call counts
                call.finished = True
                if kind == _LAST:
                    call.ends.setdefault(event[2], (event[3], "ok", ""))
                else:
                    for rank in call.ranks:
                        call.ends.setdefault(rank, (event[2], event[3], event[4]))
        return calls

    def timeline(self, ranks: Iterable[int], since: float) -> Timeline:
        """The spans of ``ranks`` that ran at or after ``since`` (wall clock)."""
        wanted = set(ranks)
        events = self._copy()
        pauses, restarts = _rank_events(events)
        spans: list[Span] = []
        for call_id, call in self._calls(events).items():
            for rank in call.ranks:
                if rank not in wanted:
                    continue
                end = call.ends.get(rank)
                if end is None:
                    span = Span(rank, call_id, call.label, call.start, None, "running")
                elif end[0] >= since:
                    span = Span(rank, call_id, call.label, call.start, *end)
                else:
                    continue
                if rank in pauses:
                    paused = _overlap(pauses[rank], span.start, span.end)
                    span = dataclasses.replace(span, paused=paused) if paused else span
                spans.append(span)
        return Timeline(spans, sorted(wanted), since, time.time(), restarts)


def _rank_events(
    events: list[tuple[Any, ...]],
) -> tuple[dict[int, list[tuple[float, float | None]]], dict[int, float]]:
    """Each rank's debugger pauses (start, end or None while paused) and its last restart."""
    pauses: dict[int, list[tuple[float, float | None]]] = {}
    restarts: dict[int, float] = {}
    for event in events:
        kind = event[0]
        if kind == _PAUSED:
            pauses.setdefault(event[1], []).append((event[2], None))
        elif kind == _RESUMED:
            open_ = pauses.get(event[1])
            if open_ and open_[-1][1] is None:
                open_[-1] = (open_[-1][0], event[2])
        elif kind == _RESTARTED:
            for rank in event[1]:
                restarts[rank] = event[2]
    return pauses, restarts


def _overlap(pauses: list[tuple[float, float | None]], start: float, end: float | None) -> float:
    """Seconds of [start, end] (end None: now) that fall within ``pauses``."""
    now = time.time()
    stop = end if end is not None else now
    total = 0.0
    for a, b in pauses:
        total += max(0.0, min(stop, b if b is not None else now) - max(start, a))
    return total


@dataclass(slots=True)
class _Call:
    """A call as read back from the log."""

    label: str
    ranks: tuple[int, ...]
    start: float
    ends: dict[int, tuple[float, Outcome, str]] = field(default_factory=dict)
    finished: bool = False


def _outcome_of(error: str | None) -> tuple[Outcome, str]:
    if error is None:
        return "ok", ""
    if error.startswith("KeyboardInterrupt"):
        return "interrupted", ""
    if error.startswith(("CallCancelled", "CancelledError", "TimeoutError")):  # cancel()
        return "cancelled", error
    return "error", error


# -- the view -----------------------------------------------------------------------

_COLOURS = {
    "ok": "#4c9a2a",
    "error": "#c62828",
    "interrupted": "#8d8d8d",
    "died": "#212121",
    "cancelled": "#b0863a",
    "running": "#1e88e5",
}
_TEXT_WIDTH = 60  # columns of the text chart
_PRIORITY = ("ok", "running", "cancelled", "interrupted", "error", "died")


def _legend(x: float, y: float, stragglers: bool) -> str:
    """A swatch and a word per outcome (and the straggler outline, when one is drawn)."""
    parts = ['<g class="legend">']
    entries = [(outcome, _COLOURS[outcome], "") for outcome in _PRIORITY]
    if stragglers:
        entries.append(("straggler", "none", ' stroke="#ff9800" stroke-width="2"'))
    for name, colour, stroke in entries:
        parts.append(
            f'<rect x="{x:.0f}" y="{y - 9}" width="10" height="10" fill="{colour}"{stroke}/>'
            f'<text class="legendtext" x="{x + 14:.0f}" y="{y}" fill="currentColor">{name}</text>'
        )
        x += 14 + 6.7 * len(name) + 12
    return "".join(parts) + "</g>"


def _drawing_order(span: Span) -> int:
    """Where spans overlap on a chart (short calls, narrow columns), the worse
    outcome is drawn last, on top."""
    return _PRIORITY.index(span.outcome)


@dataclass
class Timeline:
    """Spans of calls and cells per rank between ``since`` and ``until`` (wall clock).

    ``print(t)`` draws a text chart; in a notebook it is an SVG chart (hover a
    bar for the call, its time and how it ended). ``t.spans`` is the data,
    ``t.stragglers()`` the ranks that were slow on a call.
    """

    spans: list[Span]
    ranks: list[int]
    since: float
    until: float
    restarts: dict[int, float] = field(default_factory=dict)  # rank -> last restart

    def stragglers(
        self, factor: float = STRAGGLER_FACTOR, min_gap: float = STRAGGLER_MIN_GAP_S
    ) -> list[Straggler]:
        """Ranks that took more than ``factor`` times the median rank of the same call
        (and at least ``min_gap`` seconds longer), slowest first. Calls to a single
        rank and ranks that did not finish well are left out; time a rank spent
        paused in the debugger does not count (``Span.active``)."""
        by_call: dict[int, list[Span]] = {}
        for span in self.spans:
            if span.outcome == "ok" and span.end is not None:
                by_call.setdefault(span.call_id, []).append(span)
        found = []
        for spans in by_call.values():
            if len(spans) < 2:
                continue
            median = statistics.median(s.active for s in spans)
            found += [
                Straggler(s.rank, s.call_id, s.label, s.active, median, s.start)
                for s in spans
                if s.active > factor * median and s.active - median >= min_gap
            ]
        return sorted(found, key=lambda s: s.seconds, reverse=True)

    def latest_stragglers(
        self, calls: int = 5, dismissed: Mapping[int, int] | None = None
    ) -> dict[int, Straggler]:
        """Rank -> its slowest straggling among the last ``calls`` calls that
        finished on two or more ranks (what a dashboard marks: slow *now*). A
        rank restarted since is not marked for what its old process did, nor
        for calls up to ``dismissed[rank]`` (a call id: a mark someone dismissed)."""
        dismissed = dismissed or {}
        ends: dict[int, float] = {}
        counts: dict[int, int] = {}
        for span in self.spans:
            if span.outcome == "ok" and span.end is not None:
                ends[span.call_id] = max(ends.get(span.call_id, 0.0), span.end)
                counts[span.call_id] = counts.get(span.call_id, 0) + 1
        finished = [c for c in ends if counts[c] >= 2]
        recent = set(sorted(finished, key=ends.__getitem__)[-calls:])
        marked: dict[int, Straggler] = {}
        for straggler in self.stragglers():  # slowest first: the first per rank wins
            if straggler.at < self.restarts.get(straggler.rank, float("-inf")):
                continue  # the slow process was replaced
            if straggler.call_id <= dismissed.get(straggler.rank, -1):
                continue
            if straggler.call_id in recent and straggler.rank not in marked:
                marked[straggler.rank] = straggler
        return marked

    def _window(self) -> tuple[float, float]:
        start = min((s.start for s in self.spans), default=self.since)
        start = max(start, self.since)
        return start, max(self.until, start + 1e-3)

    def __str__(self) -> str:
        if not self.spans:
            return f"no calls on ranks {format_ranks(self.ranks)} in this window"
        t0, t1 = self._window()
        scale = _TEXT_WIDTH / (t1 - t0)
        marks = {"ok": "#", "error": "E", "interrupted": "i", "died": "X", "cancelled": "c"}
        lines = [f"timeline of the last {t1 - t0:.1f} s ('#' ran, E error, X died, > running)"]
        for rank in self.ranks:
            row = [" "] * _TEXT_WIDTH
            spans = [s for s in self.spans if s.rank == rank]
            for span in sorted(spans, key=_drawing_order):  # an error is never hidden
                a = int((max(span.start, t0) - t0) * scale)
                b = int(((span.end if span.end is not None else t1) - t0) * scale)
                mark = marks.get(span.outcome, ">")
                for i in range(min(a, _TEXT_WIDTH - 1), min(max(b, a + 1), _TEXT_WIDTH)):
                    row[i] = mark
            busy = sum(min(s.end or t1, t1) - max(s.start, t0) for s in spans)
            lines.append(f"rank {rank:>3} |{''.join(row)}| {len(spans)} calls, busy {busy:.1f} s")
        stragglers = self.stragglers()
        lines += [f"straggler: {s}" for s in stragglers[:5]]
        if len(stragglers) > 5:
            lines.append(f"... and {len(stragglers) - 5} more stragglers")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's text/plain
        printer.text(str(self))

    def _repr_html_(self) -> str:
        if not self.spans:
            return f"<p>{html.escape(str(self))}</p>"
        t0, t1 = self._window()
        label_w, width = 64, 720
        row_h = 16 if len(self.ranks) <= 32 else 8
        legend_y = row_h * len(self.ranks) + 36
        height = legend_y + 8
        slow = {(s.rank, s.call_id): s for s in self.stragglers()}
        rows = {rank: i for i, rank in enumerate(self.ranks)}
        # Drawn at its width, shrunk to fit a narrower output (text and all):
        # never a horizontal scrollbar, never a label cut off.
        full = label_w + width + 8
        parts = [
            f'<svg class="monarch-nb-timeline" xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {full} {height}" width="{full}" height="{height}" '
            f'style="max-width:100%;height:auto" font-family="monospace" font-size="11">'
        ]
        if row_h >= 12:
            for rank, i in rows.items():
                y = i * row_h + row_h - 4
                parts.append(f'<text x="0" y="{y}" fill="currentColor">rank {rank}</text>')
        for span in sorted(self.spans, key=_drawing_order):
            end = span.end if span.end is not None else t1
            x = label_w + (max(span.start, t0) - t0) / (t1 - t0) * width
            w = max((end - max(span.start, t0)) / (t1 - t0) * width, 1.0)
            y = rows[span.rank] * row_h + 2
            straggler = slow.get((span.rank, span.call_id))
            tip = f"rank {span.rank} · {span.label} (call {span.call_id}) · "
            tip += f"{span.seconds:.3f} s · {span.outcome}"
            tip += f" ({span.paused:.1f} s of it paused in the debugger)" if span.paused else ""
            tip += f": {span.detail}" if span.detail else ""
            tip += f" · straggler: {straggler}" if straggler else ""
            stroke = ' stroke="#ff9800" stroke-width="2"' if straggler else ""
            parts.append(
                f'<rect class="span {span.outcome}{" straggler" if straggler else ""}" '
                f'data-rank="{span.rank}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                f'height="{row_h - 4}" fill="{_COLOURS[span.outcome]}"{stroke}>'
                f"<title>{html.escape(tip)}</title></rect>"
            )
        axis_y = legend_y - 18
        parts.append(
            f'<text x="{label_w}" y="{axis_y}" fill="currentColor">-{t1 - t0:.1f} s</text>'
            f'<text x="{label_w + width}" y="{axis_y}" text-anchor="end" '
            f'fill="currentColor">now</text>'
        )
        parts.append(_legend(label_w, legend_y, bool(slow)) + "</svg>")
        notes = "".join(f"<li>{html.escape(str(s))}</li>" for s in list(slow.values())[:5])
        return "".join(parts) + (f"<ul>{notes}</ul>" if notes else "")
