"""``procs.status()``: a snapshot of a mesh as plain frozen dataclasses.

Observability is data: ``%mesh status``, the dashboard and tests render or
check these, and nothing else. Built from what the controller tracks for
every rank (calls in flight, heartbeats with resource samples, exits and
failures), which the event stream reports as it changes.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

from .._model._public import publish
from .._model._shape import Point, Shape
from .._wire._signed import WireStats
from ._events import RankState


class MeshState(str, enum.Enum):
    """The life cycle of a process mesh (compares equal to its string value)."""

    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class RankStatus:
    """One rank, as of the snapshot."""

    rank: int
    point: Point
    host: str
    pid: int
    state: RankState
    work: str  # the call or cell it runs now ("" when idle)
    work_seconds: float  # for how long
    cpu_percent: float | None  # over the last heartbeat interval
    rss_bytes: int | None
    gpu_memory_allocated: int | None
    gpu_memory_reserved: int | None
    gpu_utilization: float | None
    heartbeat_age: float | None  # seconds since its last heartbeat (None: none yet)
    returncode: int | None  # exit code, or -signal, once the process exited
    failure: str | None  # the last failure on this rank, one line


@dataclass(frozen=True, slots=True)
class RestartRecord:
    """One restart of some (or all) of a mesh's processes."""

    at: float  # wall clock, when the new processes were up
    ranks: tuple[int, ...]  # the ranks whose processes were replaced
    cause: str  # why: the death that triggered it, or "restart(ranks=[1])"
    automatic: bool  # made by the mesh's RestartPolicy
    respawned: tuple[str, ...]  # actor meshes spawned again on those ranks
    to_spawn_again: tuple[str, ...]  # actor meshes the caller must spawn again
    seconds: float  # from the restart's start to the ranks usable again
    replayed: tuple[str, ...] = ()  # the history steps sent again (restart(replay=True))


@dataclass(frozen=True, slots=True)
class MeshStatus:
    """A process mesh, as of the snapshot."""

    name: str
    state: MeshState
    failure: str | None
    shape: Shape
    ranks: tuple[RankStatus, ...]
    wire: WireStats
    taken_at: float  # wall clock
    restarts: tuple[RestartRecord, ...] = ()  # oldest first (the last few)

    def rank(self, rank: int) -> RankStatus:
        """The status of global rank ``rank``."""
        for status in self.ranks:
            if status.rank == rank:
                return status
        raise KeyError(f"rank {rank} is not in mesh {self.name!r} {self.shape!r}")

    def ranks_in(self, state: RankState) -> list[int]:
        return [r.rank for r in self.ranks if r.state is state]


def describe_exit(returncode: int) -> str:
    """``-9`` -> ``"was killed by signal SIGKILL"``; ``3`` -> ``"exited with code 3"``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"was killed by signal {name}"
    return f"exited with code {returncode}"


publish(globals())
