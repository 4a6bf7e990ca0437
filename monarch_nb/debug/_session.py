"""The controller side of one process group's debugging: who is paused where.

A :class:`DebugSession` follows the group's Debugger* events (on the I/O
thread) and keeps, under one condition variable, which ranks wait at a pdb
prompt, what pdb wrote on each, and how each last left pdb. The prompt
(:mod:`._prompt`) reads that state from the waiting thread and sends lines to
one rank at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._controller._events import (
    DebuggerOutput,
    DebuggerPaused,
    DebuggerResumed,
    RankFailed,
    RanksRestarted,
)
from .._controller._process_group import ProcGroup
from .._controller._status import describe_exit
from .._wire._messages import DebugInput, DebugRefused

_sessions_lock = threading.Lock()


@dataclass(frozen=True)
class Pause:
    prompt: str  # "(Pdb rank 1) "
    location: str  # "<mesh-cell-3>:2 in <module>"
    # Which pause this is: a new one each time the rank enters pdb (a breakpoint,
    # a later one after `c`), the same across the steps of one (`n`, `p x`). The
    # prompt shows its "paused at" header once per pause, not once per session.
    serial: int = 0


class DebugSession:
    """The paused ranks of one process group (see the module docstring)."""

    def __init__(self, group: ProcGroup) -> None:
        self.group = group
        self.changed = threading.Condition()
        self.paused: dict[int, Pause] = {}
        self.output: dict[int, list[str]] = {}
        self.ended: dict[int, str] = {}  # rank -> how it left pdb, until read
        self.died: dict[int, str] = {}  # rank -> how its process ended, until read
        self.attached: int | None = None
        self._answering: set[int] = set()  # ranks sent a line, not yet paused again or out
        self._serials: dict[int, int] = {}  # rank -> its current pause's serial
        self._next_serial = 0
        # Called on every change, for a waiting thread that is not in wait() (one
        # receiving its call's replies itself); any thread, under ``changed``.
        self.wakers: list[Callable[[], None]] = []
        self._subscription = group.events.subscribe(
            self._on_event,
            kinds=(DebuggerPaused, DebuggerOutput, DebuggerResumed, RankFailed, RanksRestarted),
        )

    # -- the I/O thread ---------------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        with self.changed:
            match event:
                case DebuggerPaused(rank=rank, prompt=prompt, location=location):
                    if rank not in self._answering or rank not in self._serials:
                        self._next_serial += 1  # not the answer to a line: a new pause
                        self._serials[rank] = self._next_serial
                    self.paused[rank] = Pause(prompt, location, self._serials[rank])
                    self._answering.discard(rank)
                case DebuggerOutput(rank=rank, text=text):
                    self.output.setdefault(rank, []).append(text)
                case DebuggerResumed(rank=rank, how=how):
                    self.paused.pop(rank, None)
                    self._answering.discard(rank)
                    self.ended[rank] = how
                case RankFailed(rank=rank, returncode=returncode) if returncode is not None:
                    # Only a death in the debugger is news here: one elsewhere is the
                    # failure panel's, and must not greet the next breakpoint.
                    if rank in self.paused or rank in self._answering:
                        self.died[rank] = describe_exit(returncode)
                    self.paused.pop(rank, None)
                    self._answering.discard(rank)
                case RanksRestarted(ranks=ranks):
                    for rank in ranks:  # new processes: nothing of the old ones holds
                        for table in (self.paused, self.output, self.ended, self.died):
                            table.pop(rank, None)
                        self._answering.discard(rank)
                case _:
                    return
            self._notify()

    # -- the waiting thread -------------------------------------------------------------

    def wake(self) -> None:
        """Re-check whatever the waiting thread waits for (e.g. its call completed)."""
        with self.changed:
            self._notify()

    def _notify(self) -> None:
        self.changed.notify_all()
        for waker in self.wakers:
            waker()

    def wait(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout)

    def send(self, rank: int, line: str) -> None:
        """Answer ``rank``'s prompt with ``line``; it is running until it answers."""
        with self.changed:
            self.paused.pop(rank, None)
            self.ended.pop(rank, None)
            self._answering.add(rank)
        self.group.send_debug(rank, DebugInput(line))

    def wait_answer(self, ranks: tuple[int, ...]) -> None:
        """Until each of ``ranks`` prompts again, leaves pdb, or dies."""
        self.wait(lambda: all(r in self.paused or r in self.ended or r in self.died for r in ranks))

    def refuse(self, ranks: tuple[int, ...], reason: str) -> None:
        """Make the breakpoints of ``ranks`` raise ``reason`` (nobody can answer them)."""
        for rank in ranks:
            with self.changed:
                self.paused.pop(rank, None)
                self.output.pop(rank, None)  # nobody will read what it wrote
            self.group.send_debug(rank, DebugRefused(reason))

    def take_output(self, rank: int) -> str:
        with self.changed:
            return "".join(self.output.pop(rank, []))

    def snapshot(self) -> dict[int, Pause]:
        with self.changed:
            return dict(self.paused)

    def close(self) -> None:
        self._subscription.close()


def session_for(group: ProcGroup) -> DebugSession:
    """The group's session, made on first use (any thread)."""
    with _sessions_lock:
        session = group.debugger
        if not isinstance(session, DebugSession):
            session = DebugSession(group)
            group.debugger = session
        return session
