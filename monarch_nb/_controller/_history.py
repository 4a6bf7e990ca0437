"""What built a process mesh's state, in order, so a restart can build it again.

Every push, cell and spawn on a mesh (any view of it) is a :class:`Step` of its
:class:`History`. ``restart(replay=True)`` sends the steps that succeeded
again, in order, to the new processes (see ``ProcMesh.restart``); a step
marked ``replay=False`` (``%%mesh --no-replay``) is shown but never sent
again. A restart without replay starts the history over: the processes are
empty, so nothing before it can be rebuilt from it.

What a replay cannot restore is what did not come from these steps: values
drawn at random (seed them in a cell), data received from other ranks or
files at run time that differ now, and anything done through an actor's
endpoints (only its construction is replayed).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from .._model._fold import format_ranks
from .._model._shape import Shape

StepKind = Literal["push", "cell", "spawn"]
# Long notebooks keep their first steps: those built the state the rest relies on.
MAX_STEPS = 10_000


@dataclass
class Step:
    """One thing done to a mesh's processes, as it will be done again on replay."""

    number: int  # 1, 2, ... in the order they were sent
    kind: StepKind
    label: str  # what the user sees: "cell <mesh-cell-3>", "push lr, model"
    shape: Shape  # the view it was sent to
    payload: Any  # cell: (filename, source); push: {name: value}; spawn: actor id
    replay: bool = True  # False: shown in the history, never sent again
    outcome: Literal["running", "ok", "failed"] = "running"
    failure: str = ""  # why it failed, one line

    def describe(self) -> str:
        ranks = format_ranks(self.shape.ranks)
        note = {"running": "running", "ok": "", "failed": f"failed: {self.failure}"}[self.outcome]
        if not self.replay:
            note = "not replayed (--no-replay)" + (f"; {note}" if note else "")
        return f"{self.number:>4}  {self.label} on ranks {ranks}" + (f"  [{note}]" if note else "")


def _first_clause(message: str, limit: int = 160) -> str:
    """What failed, without the advice that follows it: "rank 1 (pid 7) ... SIGKILL"."""
    first = message.splitlines()[0].split("; ")[0] if message else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


@dataclass
class History:
    """The steps of one process mesh, oldest first (thread-safe)."""

    steps: list[Step] = field(default_factory=list)
    dropped: int = 0  # steps past MAX_STEPS, not kept
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _numbers: int = 0

    def record(
        self, kind: StepKind, label: str, shape: Shape, payload: Any, *, replay: bool = True
    ) -> Step:
        with self._lock:
            self._numbers += 1
            step = Step(self._numbers, kind, label, shape, payload, replay)
            if len(self.steps) < MAX_STEPS:
                self.steps.append(step)
            else:
                self.dropped += 1
            return step

    def watch(self, step: Step, future: Any) -> None:
        """Mark ``step`` ok or failed when ``future`` (its call) is done."""

        def done(future: Any) -> None:
            error = future.exception(timeout=0)
            if error is None:
                step.outcome = "ok"
            else:
                step.outcome = "failed"
                step.failure = f"{type(error).__name__}: {_first_clause(str(error))}"

        future.add_done_callback(done)

    def clear(self) -> None:
        with self._lock:
            self.steps.clear()
            self.dropped = 0

    def to_replay(self, ranks: tuple[int, ...]) -> list[Step]:
        """The steps to send again to new processes of ``ranks``, in order."""
        chosen = set(ranks)
        with self._lock:
            steps = list(self.steps)
        return [
            s
            for s in steps
            if s.replay and s.outcome == "ok" and chosen.intersection(s.shape.ranks)
        ]

    def __str__(self) -> str:
        with self._lock:
            steps = list(self.steps)
        if not steps:
            return "no steps recorded (since the mesh started or last restarted without replay)"
        lines = [step.describe() for step in steps]
        if self.dropped:
            lines.append(f"... and {self.dropped} later step(s) not kept (limit {MAX_STEPS})")
        return "\n".join(lines)
