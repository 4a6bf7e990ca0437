"""Hang diagnosis: which ranks wait in which torch.distributed collective, and where
the ranks that have not entered it are instead.

Read from each rank's Python stack (its wire thread answers while the main
thread waits in a collective: gloo and NCCL release the GIL); a rank that
cannot answer (stuck in C holding the GIL) is read from outside with py-spy
when it is installed. torch.distributed's flight recorder (sequence numbers of
collectives) exists for NCCL only and is not read yet: the report says its
source.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._model._fold import fold, format_ranks
from .._model._public import publish
from .._services import _py_spy
from .._wire._messages import AWAITING_HEADING, StatusReply
from ._stacks import query, run_py_spy

if TYPE_CHECKING:
    from ._group_protocol import StackedGroup

# The collectives of torch.distributed (distributed_c10d.py): the outermost such
# frame is what user code called (all_gather_object calls all_gather inside).
COLLECTIVES = frozenset(
    {
        "all_gather",
        "all_gather_coalesced",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_reduce",
        "all_reduce_coalesced",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "batch_isend_irecv",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "monitored_barrier",
        "recv",
        "recv_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "send",
        "send_object_list",
    }
)
_C10D = "torch/distributed/distributed_c10d.py"


@dataclass(frozen=True)
class Frame:
    """One Python frame: ``file:line in function``, with its source line if known."""

    file: str
    line: int
    function: str
    code: str = ""

    def __str__(self) -> str:
        if self.code:
            return f"`{self.code}` at {self.file}:{self.line} in {self.function}"
        return f"{self.file}:{self.line} in {self.function}"


_PY_FRAME = re.compile(r'^  File "(.*)", line (\d+), in (.*)$')
_SPY_FRAME = re.compile(r"^\s+(\S.*) \((.+):(\d+)\)$")


def split_awaiting(text: str) -> tuple[str, tuple[str, ...]]:
    """A status's stack text as (the main thread's stack, one line per async endpoint
    call waiting at an await: ``Gen.generate awaits at gen.py:12 in generate: ...``)."""
    at = text.find(AWAITING_HEADING)
    if at < 0:
        return text, ()
    lines = text[at:].splitlines()[1:]
    return text[:at], tuple(line.strip() for line in lines if line.strip())


def parse_python_stack(text: str) -> list[Frame]:
    """Frames of a ``traceback.format_stack`` text, outermost first."""
    frames: list[Frame] = []
    for line in text.splitlines():
        match = _PY_FRAME.match(line)
        if match:
            file, lineno, function = match.groups()
            frames.append(Frame(file, int(lineno), function))
        elif frames and line.startswith("    ") and not frames[-1].code:
            last = frames[-1]
            frames[-1] = Frame(last.file, last.line, last.function, line.strip())
    return frames


def parse_py_spy_main_thread(text: str) -> list[Frame]:
    """Python frames of the main thread of a ``py-spy dump``, outermost first."""
    frames: list[Frame] = []
    in_main = False
    for line in text.splitlines():
        if line.startswith("Thread "):
            in_main = '"MainThread"' in line
        elif in_main:
            match = _SPY_FRAME.match(line)
            if match and (match[2].endswith(".py") or match[2].startswith("<")):
                frames.append(Frame(match[2], int(match[3]), match[1]))
    return frames[::-1]


def _is_library(file: str) -> bool:
    return (
        "/monarch_nb/" in file
        or "site-packages/" in file
        or "dist-packages/" in file
        or "/lib/python3" in file
        or file.startswith("<frozen ")
    )


@dataclass(frozen=True)
class RankPlace:
    """Where one rank is: in a collective (``collective`` set, ``frame`` its call
    site), elsewhere in user code (``frame``), idle, or unknown (``note``)."""

    rank: int
    collective: str | None
    frame: Frame | None
    work: str
    seconds: float
    note: str = ""
    stuck: bool = False  # it could not answer: read from outside with py-spy
    collectives: int = -1  # collectives its default process group issued, if known
    awaiting: tuple[str, ...] = ()  # async endpoint calls waiting at an await, and where

    @property
    def idle(self) -> bool:
        """Running nothing, and no async endpoint call waiting either."""
        return not (self.work or self.collective or self.note or self.stuck or self.awaiting)

    def where(self) -> str:
        if self.note:
            return self.note
        if self.idle:
            return "idle (running no call or cell)"
        awaiting = ""
        if self.awaiting:
            awaiting = (
                f"waiting at an await in {len(self.awaiting)} async endpoint call(s): "
                + "; ".join(self.awaiting)
            )
        if not (self.work or self.collective or self.stuck):
            return awaiting
        place = f"in {self.frame}" if self.frame is not None else "in monarch_nb's own code"
        issued = f"; {self.collectives} collective(s) issued" if self.collectives >= 0 else ""
        also = f"; also {awaiting}" if awaiting else ""
        if self.stuck:
            return f"{place}, stuck in C holding the GIL (read with py-spy){issued}{also}"
        return f"{place}, running {self.work} for {self.seconds:.1f} s{issued}{also}"

    def collective_label(self) -> str:
        """``all_reduce #41``: its name and, where known, which of the group's
        collectives it is (the process group's sequence number)."""
        number = f" #{self.collectives}" if self.collectives > 0 else ""
        return f"{self.collective}{number}"


def classify(
    rank: int,
    frames: list[Frame],
    work: str,
    seconds: float,
    *,
    stuck: bool = False,
    collectives: int = -1,
) -> RankPlace:
    """Place a rank by its main-thread frames (outermost first)."""
    collective = None
    for i, frame in enumerate(frames):
        if frame.file.endswith(_C10D) and frame.function in COLLECTIVES:
            caller = next((f for f in reversed(frames[:i]) if not _is_library(f.file)), None)
            return RankPlace(
                rank, frame.function, caller, work, seconds, stuck=stuck, collectives=collectives
            )
    user = next((f for f in reversed(frames) if not _is_library(f.file)), None)
    if user is None and frames and (work or stuck):
        user = frames[-1]  # only library frames: say the innermost one
    return RankPlace(rank, collective, user, work, seconds, stuck=stuck, collectives=collectives)


@dataclass(frozen=True)
class Diagnosis:
    """Where each rank of a mesh is, read for a hang: ``str(d)`` says which ranks wait
    in which collective and where the others are (``places`` holds the data)."""

    mesh: str
    places: tuple[RankPlace, ...]
    source: str
    # Ranks of the mesh that were not read (a view's diagnosis): a collective may
    # wait for one of them, so the verdict never says "every rank" then.
    unread: tuple[int, ...] = ()

    def collectives(self) -> dict[str, tuple[int, ...]]:
        """``{"all_reduce #5": (0, 2, 3)}``: the ranks waiting in each collective
        (numbered by the process group's sequence number where known)."""
        out: dict[str, list[int]] = {}
        for place in self.places:
            if place.collective is not None:
                out.setdefault(place.collective_label(), []).append(place.rank)
        return {name: tuple(ranks) for name, ranks in out.items()}

    def missing(self) -> tuple[int, ...]:
        """Ranks in no collective while others wait in one: the ones holding them up."""
        if not self.collectives():
            return ()
        return tuple(p.rank for p in self.places if p.collective is None)

    def __str__(self) -> str:
        lines = [f"mesh {self.mesh!r}, {len(self.places)} rank(s), from {self.source}:"]
        waiting = [p for p in self.places if p.collective is not None]
        for ranks, place in fold(
            ((p.rank, p) for p in waiting), key=lambda p: (p.collective_label(), p.frame)
        ):
            called = f", called from {place.frame}" if place.frame is not None else ""
            lines.append(f"  {_label(ranks)} waiting in {place.collective_label()}{called}")
        others = [p for p in self.places if p.collective is None]
        verb = "not in it" if len(self.collectives()) == 1 else "in no collective"
        for ranks, place in fold(((p.rank, p) for p in others), key=lambda p: p.where()):
            prefix = f"{verb}: " if waiting else ""
            lines.append(f"  {_label(ranks)} {prefix}{place.where()}")
        lines.append(self._verdict())
        return "\n".join(lines)

    def _verdict(self) -> str:
        collectives = self.collectives()
        missing = self.missing()
        if len(collectives) > 1:
            return (
                "→ ranks wait in different collectives: they called them in a different "
                "order (or with different groups)"
            )
        if missing:
            name = next(iter(collectives))
            idle = [r for r in missing if self._place(r).idle]
            why = ""
            if idle:
                who = "" if len(idle) == len(missing) else f"{_label(idle)}: "
                why = f" ({who}idle: the call or cell ended there without calling it)"

            return f"→ {_label(missing)} never entered {name}{why}: the others wait for it"
        if collectives and self.unread:
            return (
                f"→ every rank read is in the collective; {_label(self.unread)} of mesh "
                f"{self.mesh!r} {'was' if len(self.unread) == 1 else 'were'} not read and may "
                "be the one it waits for: diagnose the whole mesh"
            )
        if collectives:
            return (
                "→ every rank is in the collective: it is slow or stuck in the backend "
                "(network, a peer's timeout), not waiting for a missing rank"
            )
        awaiting = [p.rank for p in self.places if p.awaiting]
        if awaiting:
            return (
                "→ no rank is in a torch.distributed collective; "
                f"{_label(awaiting)} {'has' if len(awaiting) == 1 else 'have'} async "
                "endpoint calls waiting at an await (for an event, a lock or another "
                "call that has not come): see where each waits above; interrupting the "
                "ranks (procs.interrupt(), the panel's interrupt) cancels them"
            )
        return "→ no rank is in a torch.distributed collective"

    def _place(self, rank: int) -> RankPlace:
        return next(p for p in self.places if p.rank == rank)

    def verdict(self) -> str:
        """The last line of the report: who holds up whom (``→ rank 1 never entered ...``)."""
        return self._verdict()

    def _repr_pretty_(self, printer: object, cycle: bool) -> None:
        printer.text(str(self))  # type: ignore[attr-defined]


def _label(ranks: tuple[int, ...] | list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _dump_or_why(group: StackedGroup, rank: int) -> list[Frame] | str:
    """The main thread's frames of ``rank`` read by py-spy, or why it could not."""
    try:
        return parse_py_spy_main_thread(
            run_py_spy(group, rank, mode="dump", native=False, full_filenames=True).stdout
        )
    except Exception as exc:  # py-spy missing or refused: say why, go on
        return str(exc)


def diagnose(
    group: StackedGroup, ranks: tuple[int, ...], timeout: float, *, py_spy: bool = True
) -> Diagnosis:
    """Place every rank of ``ranks``; ``py_spy``: read a rank that cannot answer from
    outside with py-spy (up to 30 s), where py-spy is installed.

    The one diagnosis: ``%mesh why``, ``procs.diagnose()``, the message of a stop
    that had to kill, and the dashboard's hang mark all come from here. Ranks of
    the group left out of ``ranks`` are named as not read (see :meth:`Diagnosis._verdict`).
    """
    answers = query(group, ranks, timeout)
    silent = [r for r, a in answers.items() if not isinstance(a, StatusReply)]
    live = [r for r in silent if group.workers[r].returncode is None] if py_spy else []
    dumps = _py_spy.each(live, lambda rank: _dump_or_why(group, rank))
    places = []
    for rank, answer in answers.items():
        if isinstance(answer, StatusReply):
            stack, awaiting = split_awaiting(answer.stack)
            place = classify(
                rank,
                parse_python_stack(stack),
                answer.work,
                answer.work_seconds,
                collectives=answer.collectives,
            )
            places.append(dataclasses.replace(place, awaiting=awaiting))
            continue
        note = answer.removeprefix("<no stack: ").removesuffix(">")
        dump = dumps.get(rank)
        if isinstance(dump, list):
            places.append(classify(rank, dump, "", 0.0, stuck=True))
        else:
            note += f"; py-spy could not read it either: {dump}" if dump else ""
            places.append(RankPlace(rank, None, None, "", 0.0, note=note))
    used_py_spy = any(isinstance(d, list) for d in dumps.values())
    source = "each rank's Python stack"
    if used_py_spy:
        source += " (py-spy for ranks that could not answer)"
    source += "; torch.distributed's flight recorder (NCCL only) is not read"
    unread = tuple(w.rank for w in group.workers if w.rank not in answers and w.returncode is None)
    return Diagnosis(group.name, tuple(places), source, unread)


def diagnose_all(group: StackedGroup, timeout: float, *, py_spy: bool = True) -> Diagnosis:
    """:func:`diagnose` of every rank of ``group``: a rank that never joined a
    collective is often idle, so not among the ranks still running the call."""
    return diagnose(group, tuple(w.rank for w in group.workers), timeout, py_spy=py_spy)


publish(globals())
