"""The dashboard's live hang mark: the tile of a rank that never joined a collective.

A collective that one rank skips shows as the other ranks busy for long while
that rank sits idle (or busy elsewhere). Then, and only then (a training cell
busy on every rank is no hang), the dashboard runs the one diagnosis
(``_controller._diagnose``, what ``%mesh why`` and the stop button report; no
py-spy, so it never stalls the redraws) at most every ``CHECK_EVERY_S``, and
marks the tiles of the ranks it names as never having entered the collective:
``never joined all_reduce #3 · ranks 0,2 wait`` and a pointer to the rank's
"why" action below the tiles, before anyone presses stop. The dashboard's
actions bar picks that rank and shows the diagnosis, as its "why" would.

``MONARCH_NB_HANG_AFTER`` (seconds, default 5) is how long ranks must be busy
while another is not before the diagnosis runs.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Sequence
from typing import Any

from .._controller._diagnose import diagnose_all
from .._controller._events import RankState
from .._controller._status import RankStatus
from .._model._fold import format_ranks

CHECK_EVERY_S = 3.0


def hang_after_s() -> float:
    return float(os.environ.get("MONARCH_NB_HANG_AFTER", "5"))


def suspect(ranks: Sequence[RankStatus], after_s: float) -> bool:
    """Ranks busy for ``after_s`` s or more while some other rank is not busy with
    the same work: what a collective that a rank never joined looks like."""
    long = [r for r in ranks if r.state is RankState.BUSY and r.work_seconds >= after_s]
    if not long:
        return False
    works = {r.work for r in long}
    return any(r.state is not RankState.BUSY or r.work not in works for r in ranks)


def mark_html(collective: str, waiting: Sequence[int]) -> str:
    """The tile's row: which collective it never joined, who waits, where to ask why."""
    who = f"rank {waiting[0]} waits" if len(waiting) == 1 else f"ranks {format_ranks(waiting)} wait"
    text = f"⚠ never joined {collective} · {who}"
    tip = f"{text} for it: the 'why' action below the tiles (or %mesh why) says where each rank is"
    return (
        f'<div class="mnb-hang" title="{html.escape(tip)}" style="font-weight:bold;'
        "color:var(--jp-warn-color0,#8a4b00);white-space:nowrap;overflow:hidden;"
        f'text-overflow:ellipsis"><small>{html.escape(text)} · why ↓</small></div>'
    )


class HangWatch:
    """Marks for the tiles of ranks a collective waits for; :meth:`update` on each draw."""

    def __init__(self, after_s: float | None = None) -> None:
        self.after_s = hang_after_s() if after_s is None else after_s
        self.marks: dict[int, str] = {}
        self.verdict = ""  # the diagnosis's last line, while marks are shown
        self.report = ""  # the whole diagnosis, as %mesh why shows it
        self._checked = 0.0

    def update(self, procs: Any, ranks: Sequence[RankStatus]) -> dict[int, str]:
        if not suspect(ranks, self.after_s):
            return self._clear()
        now = time.monotonic()
        if now - self._checked < CHECK_EVERY_S:
            return self.marks
        self._checked = now
        try:
            report = diagnose_all(procs._group, timeout=1.0, py_spy=False)
        except Exception:  # a stopped or replaced mesh: nothing to mark
            return self._clear()
        collectives = report.collectives()
        missing = report.missing()
        if len(collectives) != 1 or not missing:
            return self._clear()
        ((name, waiting),) = collectives.items()
        self.marks = {rank: mark_html(name, waiting) for rank in missing}
        self.verdict, self.report = report.verdict(), str(report)
        return self.marks

    def _clear(self) -> dict[int, str]:
        self.marks, self.verdict, self.report = {}, "", ""
        return self.marks
