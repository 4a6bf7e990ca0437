"""Where every rank is: Python stacks (asked of each rank's wire thread), native
stacks and flame-graph profiles (py-spy, from outside the rank), grouped so that
identical stacks are shown once with their rank set.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._model._errors import MeshUsageError
from .._model._fold import MAX_GROUPS_SHOWN, fold, format_ranks, more
from .._model._public import publish
from .._services import _py_spy
from .._wire._messages import StatusReply
from ._status import describe_exit

if TYPE_CHECKING:
    from ._group_protocol import StackedGroup


def _label(ranks: Iterable[int]) -> str:
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


class Stacks(dict[int, str]):
    """Each rank's stack as text (a ``dict``: ``stacks[3]``), innermost frame last for
    Python stacks and first for native ones (py-spy's order).

    ``str(stacks)`` and a notebook show each distinct stack once, labelled with
    its ranks (``ranks 0-6``), so 64 ranks in one collective read as one stack.
    """

    def __init__(self, stacks: Mapping[int, str], *, native: bool = False) -> None:
        super().__init__(stacks)
        self.native = native

    def groups(self) -> list[tuple[tuple[int, ...], str]]:
        """``[(ranks, stack), ...]``: ranks whose stacks are identical, in rank order.

        Native stacks compare without thread ids, addresses and whether the
        thread held the GIL at the instant it was sampled."""
        return fold(sorted(self.items()), key=_group_key)

    def __str__(self) -> str:
        groups = self.groups()
        what = "native and Python stacks (py-spy)" if self.native else "Python stacks"
        parts = [f"{what} of {len(self)} rank(s), {len(groups)} distinct:"]
        for ranks, text in groups[:MAX_GROUPS_SHOWN]:
            parts.append(f"── {_label(ranks)} ──\n{text.rstrip()}")
        tail = more(len(groups), what="more distinct stacks")
        if tail:
            parts.append(tail)
        return "\n".join(parts)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


_THREAD = re.compile(r'^Thread (?:0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_ADDRESS = re.compile(r"\b0x[0-9A-Fa-f]{5,}\b")
_LONGEST_FRAME = 200
_STATUS = re.compile(r'^(Thread "[^"]*") \([^)]*\)$', re.MULTILINE)


def normalize_py_spy(text: str) -> str:
    """A ``py-spy dump`` without its header (pid, command line, Python version) and
    with what differs between identical processes (thread ids, addresses) masked:
    ``Thread "MainThread" (active+gil)`` then its frames, innermost first."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _THREAD.match(line)), len(lines))
    out = []
    for line in lines[start:]:
        match = _THREAD.match(line)
        if match:
            status, name = match.groups()
            out.append(f'Thread "{name or "?"}" ({status})')
        else:
            line = _ADDRESS.sub("0x…", line)
            if len(line) > _LONGEST_FRAME:  # C++ templates spell out every argument
                line = line[: _LONGEST_FRAME - 1] + "…"
            out.append(line)
    return "\n".join(out).strip() + "\n"


def _group_key(text: str) -> str:
    return _STATUS.sub(r"\1", text)


def query(
    group: StackedGroup, ranks: tuple[int, ...], timeout: float
) -> dict[int, StatusReply | str]:
    """Each rank's :class:`StatusReply` (its work and main-thread stack), or why there
    is none: its wire thread answers even while user code runs."""
    future = group.query(ranks)
    try:
        replies = future.get(timeout=timeout)
    except TimeoutError:
        replies = group.end_query(future)
    answers: dict[int, StatusReply | str] = {}
    for rank in ranks:
        reply = replies.get(rank)
        if reply is not None:
            answers[rank] = reply
        else:
            answers[rank] = f"<no stack: {_why_silent(group, rank, timeout)}>"
    return answers


def _why_silent(group: StackedGroup, rank: int, timeout: float) -> str:
    worker = group.workers[rank]
    if worker.returncode is not None:
        return f"the process {describe_exit(worker.returncode)}"
    return (
        f"no answer within {timeout:g} s (stopped, or stuck in C holding the GIL: "
        "stacks(native=True) reads it from outside)"
    )


def python_stacks(group: StackedGroup, ranks: tuple[int, ...], timeout: float) -> Stacks:
    answers = query(group, ranks, timeout)
    return Stacks({r: a.stack if isinstance(a, StatusReply) else a for r, a in answers.items()})


def run_py_spy(group: StackedGroup, rank: int, **options: Any) -> _py_spy.Outcome:
    """py-spy on ``rank``, run on its host (here, or by its host's agent); raises
    ProfilerUnavailable or PySpyFailed (see ``_py_spy.check``)."""
    worker = group.workers[rank]
    options.setdefault("timeout", _py_spy.DUMP_TIMEOUT_S)
    outcome = worker.py_spy(**options)
    host = None if worker.route is None else worker.host
    return _py_spy.check(outcome, rank=rank, pid=worker.pid, host=host)


def _check_here(group: StackedGroup, ranks: tuple[int, ...]) -> None:
    """Fail once, up front, if py-spy is missing here and some rank runs here."""
    if any(group.workers[r].route is None for r in ranks):
        _py_spy.executable()


def native_stacks(group: StackedGroup, ranks: tuple[int, ...], timeout: float) -> Stacks:
    """py-spy dumps (Python and native frames of every thread), in parallel."""
    _check_here(group, ranks)

    def one(rank: int) -> str:
        worker = group.workers[rank]
        if worker.returncode is not None:
            return f"<no stack: the process {describe_exit(worker.returncode)}>"
        try:
            outcome = run_py_spy(group, rank, mode="dump", native=True, timeout=timeout)
        except _py_spy.PySpyFailed as exc:
            return f"<no stack: {exc}>"
        return normalize_py_spy(outcome.stdout)

    return Stacks(_py_spy.each(ranks, one), native=True)


@dataclass(frozen=True)
class Profile:
    """Flame graphs of each rank over ``seconds``, recorded by py-spy at the same time.

    ``files[rank]`` is py-spy's output (an SVG flame graph, or speedscope JSON);
    a notebook shows the SVGs in the cell; ``save(directory)`` writes them out.
    ``notes[rank]`` says why a rank has none (it exited, it never ran Python).
    """

    seconds: int
    format: str
    files: dict[int, bytes]
    notes: dict[int, str] = field(default_factory=dict)

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``rank<N>.svg`` (or ``.json``) per rank into ``directory``; their paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        suffix = ".svg" if self.format == "flamegraph" else ".json"
        paths = []
        for rank, data in sorted(self.files.items()):
            path = directory / f"rank{rank}{suffix}"
            path.write_bytes(data)
            paths.append(path)
        return paths

    def __str__(self) -> str:
        lines = [f"profile of {len(self.files) + len(self.notes)} rank(s) over {self.seconds} s:"]
        for rank, data in sorted(self.files.items()):
            lines.append(f"  rank {rank}: {self.format}, {len(data)} bytes")
        for rank, note in sorted(self.notes.items()):
            lines.append(f"  rank {rank}: {note}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        parts = [f"<div><b>profile over {self.seconds} s</b> (py-spy)</div>"]
        for rank, data in sorted(self.files.items()):
            if self.format == "flamegraph":
                # An <img>, not inline SVG: py-spy's SVG carries scripts that a
                # notebook's sanitizer would strip, and its ids would collide.
                src = "data:image/svg+xml;base64," + base64.b64encode(data).decode()
                body = f'<img src="{src}" style="width:100%" alt="rank {rank} flame graph">'
            else:
                body = "speedscope JSON: profile.save(dir), then open it at speedscope.app"
            parts.append(f"<details open><summary>rank {rank}</summary>{body}</details>")
        for rank, note in sorted(self.notes.items()):
            parts.append(f"<div>rank {rank}: {html.escape(note)}</div>")
        return "\n".join(parts)


_FORMATS = ("flamegraph", "speedscope")


def profile(
    group: StackedGroup,
    ranks: tuple[int, ...],
    seconds: float,
    *,
    format: str,
    native: bool,
    rate: int,
) -> Profile:
    """``py-spy record`` on every rank at once for ``seconds``."""
    if format not in _FORMATS:
        raise MeshUsageError(f"format must be one of {_FORMATS}, got {format!r}")
    if not seconds > 0:
        raise MeshUsageError(f"seconds must be positive, got {seconds!r}")
    whole = max(1, math.ceil(seconds))  # py-spy records whole seconds
    _check_here(group, ranks)
    notes: dict[int, str] = {}

    def one(rank: int) -> bytes | None:
        worker = group.workers[rank]
        if worker.returncode is not None:
            notes[rank] = f"the process {describe_exit(worker.returncode)}"
            return None
        try:
            data = run_py_spy(
                group,
                rank,
                mode="record",
                native=native,
                seconds=whole,
                fmt=format,
                rate=rate,
                timeout=whole + _py_spy.DUMP_TIMEOUT_S,
            ).data
        except _py_spy.PySpyFailed as exc:
            notes[rank] = str(exc)
            return None
        if not data:
            notes[rank] = "no samples (the rank ran no Python code: idle, or waiting)"
            return None
        return data

    recorded = _py_spy.each(ranks, one)
    files = {r: data for r, data in recorded.items() if data is not None}
    return Profile(whole, format, files, notes)


publish(globals())
