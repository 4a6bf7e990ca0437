"""Process meshes (views over a group of worker processes) and hosts."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ._actor import Actor, ActorMesh, unpicklable_argument
from ._calls import PendingCall
from ._errors import MeshFailure, MeshUsageError
from ._process_group import Failed, ProcGroup, Running, Starting, Stopped, check_gpus
from ._shape import Point, Selector, Shape
from ._wire import WireStats

A = TypeVar("A", bound=Actor)
_actor_ids = itertools.count(1)


@dataclass(frozen=True)
class ProcInfo:
    """One process of a mesh, as ``statistics()`` reports it."""

    rank: int
    pid: int
    state: str  # "starting", "running", "exited", "failed", "stopped"
    returncode: int | None


@dataclass(frozen=True)
class MeshStatistics:
    """A snapshot of a process mesh and of this controller's wire counters."""

    name: str
    state: str
    failure: str | None
    procs: tuple[ProcInfo, ...]
    wire: WireStats


class ProcMesh:
    """A mesh of worker processes. Views made by :meth:`slice` share the processes.

    Start one with ``this_host().spawn_procs(per_host={"procs": 4})``; use it as
    a context manager to stop it at the end.
    """

    def __init__(self, group: ProcGroup, shape: Shape) -> None:
        self._group = group
        self._shape = shape

    # -- shape --------------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def name(self) -> str:
        return self._group.name

    def __len__(self) -> int:
        return len(self._shape)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._group.name!r} {self._shape!r} {self.state}>"

    def slice(self, **selection: Selector) -> ProcMesh:
        """A view of the selected processes: ``procs.slice(procs=slice(0, 2))``."""
        return ProcMesh(self._group, self._shape.slice(**selection))

    def point_of_rank(self, rank: int) -> Point:
        return self._shape.point_of_rank(rank)

    def rank_of_point(self, point: Mapping[str, int]) -> int:
        return self._shape.rank_of_point(point)

    # -- state --------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"starting"``, ``"running"``, ``"failed"`` or ``"stopped"``."""
        match self._group.state:
            case Starting():
                return "starting"
            case Running():
                return "running"
            case Failed():
                return "failed"
            case Stopped():
                return "stopped"
        raise AssertionError(self._group.state)

    @property
    def failure(self) -> MeshFailure | None:
        """Why the mesh failed, or None."""
        state = self._group.state
        return state.error if isinstance(state, Failed) else None

    @property
    def pids(self) -> list[int]:
        return [self._group.workers[r].pid for r in self._shape.ranks]

    def statistics(self) -> MeshStatistics:
        """A snapshot: each process's pid and state, and the wire counters."""
        group = self._group
        procs = []
        for rank in self._shape.ranks:
            w = group.workers[rank]
            state = (
                "exited"
                if w.returncode is not None
                else self.state
                if rank in group.ready_ranks
                else "starting"
            )
            procs.append(ProcInfo(rank, w.pid, state, w.returncode))
        failure = self.failure
        return MeshStatistics(
            group.name,
            self.state,
            str(failure) if failure else None,
            tuple(procs),
            group.controller.stats.snapshot(),
        )

    def busy_ranks(self) -> list[int]:
        """Ranks of this view with calls or cells in flight."""
        load = self._group.controller.outstanding
        return [r for r in self._shape.ranks if load.get((self._group.id, r), 0) > 0]

    def interrupt(self, ranks: Iterable[int] | None = None) -> None:
        """Raise KeyboardInterrupt in the user code running on ``ranks`` (default:
        the busy ones). Python code stops at once; code stuck in C does not, see
        :meth:`kill`.
        """
        targets = self.busy_ranks() if ranks is None else list(ranks)
        for rank in targets:
            worker = self._group.workers[rank]
            if worker.returncode is None:
                try:
                    os.kill(worker.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass

    def kill(self, ranks: Iterable[int]) -> None:
        """Kill ``ranks`` with SIGKILL (a rank stuck in C ignores interrupts).

        The mesh is then failed, naming those ranks, until :meth:`restart`.
        """
        for rank in ranks:
            worker = self._group.workers[rank]
            if worker.returncode is None:
                try:
                    os.kill(worker.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def on_event(self, listener: Callable[[str, Any], None]) -> None:
        """Call ``listener(event, detail)`` on the I/O thread for supervision events:
        ``"worker_exited"``, ``"mesh_failed"``, ``"actor_failed"``. Keep it short.
        """
        self._group.add_listener(listener)

    # -- actors ---------------------------------------------------------------------

    def spawn(self, name: str, actor_class: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Start one ``actor_class(*args, **kwargs)`` in every process of this mesh.

        Blocks until every instance is constructed. Raises SpawnError with the
        remote traceback if ``__init__`` raised on any rank (the process mesh
        stays usable), or MeshFailure if the mesh is failed.
        """
        if not (isinstance(actor_class, type) and issubclass(actor_class, Actor)):
            raise MeshUsageError(
                f"spawn({name!r}, ...) needs a subclass of monarch_nb.Actor, got {actor_class!r}"
            )
        group = self._group
        failure = group.failure_for(self._shape.ranks)
        if failure is not None:
            raise failure
        actor_id = next(_actor_ids)
        call = PendingCall(
            group.controller.next_call_id(),
            self._shape,
            actor=f"{actor_class.__name__} {name!r}",
            endpoint="",
            spawn=True,
        )
        shape = self._shape
        meta = ("spawn", call.call_id, actor_id, name, shape.labels, shape.sizes, shape.ranks)
        try:
            message = group.signer.encode(meta, (actor_class, args, kwargs))
        except Exception as exc:
            raise unpicklable_argument(
                f"{actor_class.__name__}.__init__", args, kwargs, exc
            ) from exc
        group.controller.send(group, shape.ranks, message, call)
        call.future.get()
        return ActorMesh(
            self, shape, actor_id=actor_id, name=name, cls=actor_class, generation=group.generation
        )

    # -- life cycle -----------------------------------------------------------------

    def stop(self) -> None:
        """Stop every process of this mesh (all views), waiting for them to exit."""
        self._group.stop()

    def restart(self) -> None:
        """Replace every process with a fresh one; spawn actors again afterwards."""
        self._group.restart()

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __reduce__(self):
        raise MeshUsageError(
            f"process mesh {self.name!r} cannot be sent to a rank; keep it on the controller"
        )


class HostMesh:
    """The hosts processes can be started on. ``this_host()`` is the local one."""

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        name: str = "procs",
    ) -> ProcMesh:
        """Start worker processes: ``per_host={"procs": 4}`` or ``{"gpus": 4}``.

        ``{"gpus": N}`` gives each rank one GPU through ``CUDA_VISIBLE_DEVICES``
        and fails at once if the host has fewer. Every worker gets ``RANK``,
        ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
        ``MASTER_PORT`` (a free port), so ``torch.distributed.init_process_group``
        needs no arguments. ``env`` adds variables.
        """
        per_host = dict(per_host or {"procs": 1})
        for dim, size in per_host.items():
            if not isinstance(dim, str) or not isinstance(size, int) or size < 1:
                raise MeshUsageError(
                    f"per_host must map dimension names to positive ints, got {dim!r}: {size!r}"
                )
        gpus = "gpus" in per_host
        if gpus:
            check_gpus(per_host["gpus"])
        if env is not None:
            bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
            if bad:
                raise MeshUsageError(f"env values must be strings; {bad[0]!r} is not")
        group = ProcGroup(per_host, env=env, gpus=gpus, name=name)
        group.start()
        return ProcMesh(group, group.shape)


def this_host() -> HostMesh:
    """The host this controller runs on."""
    return HostMesh()
