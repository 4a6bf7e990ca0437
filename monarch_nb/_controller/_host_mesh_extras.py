"""What a HostMesh says and does beyond spawning, as Monarch's does: its shape
(``extent``, ``slice``), ``initialized``, ``stop()``, ``with_python_executable``,
``stream_logs``, and what ``spawn_procs(bootstrap=, proc_bind=)`` hands every
new worker.

A host mesh has one dimension, ``hosts``. A slice is a view: it reads as the
hosts it keeps, and processes are spawned on a whole mesh only (a slice of a
multi-host mesh refuses, naming the fix); ``stop()`` and ``shutdown()`` belong
to the mesh that owns the hosts, as in Monarch.
"""

from __future__ import annotations

import os
import socket
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from .._model._errors import MeshFailure, MeshUsageError
from .._model._future import Future, completed, failed
from .._model._shape import MeshShape, Shape
from .._services._proc_bind import BOOTSTRAP_FAILED, check_proc_bind
from ._lifecycle import Failed

if TYPE_CHECKING:
    from ._client import Controller
    from ._hosts import HostAgents


class HostMeshShutDown(MeshUsageError, RuntimeError):
    """A host mesh used after its ``shutdown()``: a RuntimeError too, as Monarch's."""

    def __init__(self, verb: str) -> None:
        super().__init__(
            f"{verb}: HostMesh has already been shut down (its agents are gone); "
            "start a new host mesh"
        )


class HostMeshBase(MeshShape):
    """The shape and life of a host mesh; HostMesh adds spawning."""

    def __init__(
        self,
        controller: Controller | None = None,
        agents: HostAgents | None = None,
        *,
        shape: Shape | None = None,
        python: str | None = None,
        owner: str | None = None,
    ) -> None:
        self._controller = controller
        self._agents = agents
        # Which handle of the hosts spawned a process mesh: stop() stops only those
        # of its own handle (its slices and views share it), as Monarch's, so two
        # job.state() handles on the same agents do not stop each other's meshes.
        self._owner = owner or uuid.uuid4().hex
        count = 1 if agents is None else len(agents.agents)
        self._shape = shape if shape is not None else Shape(("hosts",), (count,), range(count))
        self._python = python

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def _labels(self) -> tuple[str, ...]:  # type: ignore[override]
        # A tuple on a host mesh, a list on a process mesh: as Monarch's are.
        return tuple(self._shape.labels)

    def _new_with_shape(self, shape: Shape) -> Any:
        return type(self)(
            self._controller, self._agents, shape=shape, python=self._python, owner=self._owner
        )

    def _new_handle(self) -> Any:
        """Another handle on the same hosts: its process meshes are its own to stop()."""
        return type(self)(self._controller, self._agents, shape=self._shape, python=self._python)

    @property
    def hosts(self) -> list[str]:
        """The hosts' names (as given to the launcher, or as SLURM named them)."""
        if self._agents is None:
            return [socket.gethostname()]
        return [self._agents.agents[i].label for i in self._shape.ranks]

    def __len__(self) -> int:
        return len(self._shape)

    def _whole(self) -> bool:
        count = 1 if self._agents is None else len(self._agents.agents)
        return self._shape.ranks == tuple(range(count))

    def _check_whole(self, verb: str) -> None:
        if not self._whole():
            raise MeshUsageError(
                f"{verb} on a slice of a host mesh ({self.hosts}): only the mesh that "
                "started the hosts can; call it on that mesh, or start a host mesh over "
                "just these hosts"
            )

    @property
    def stream_logs(self) -> bool:
        """False, as Monarch's host meshes from jobs and ``this_host()``: process
        meshes spawned here do not start in Monarch's log-streaming mode (each
        line held up to 3 s and identical lines of many ranks folded at the
        client); each rank's line prints as it comes, prefixed by its rank.
        ``procs.logging_option(aggregate_window_sec=3)`` turns folding on,
        ``stream_to_client=False`` silences a mesh (its lines stay in
        ``procs.logs()``)."""
        return False

    @property
    def initialized(self) -> Future[Literal[True]]:
        """A future of True once the hosts are up: already done, since
        ``this_host()``, ``ssh_hosts()`` and the others return once they are."""
        return completed(True)

    def stop(self) -> Future[None]:
        """Stop every process mesh this handle started on these hosts (another
        ``job.state()``'s are left running), keeping the hosts (their agents) for
        new ones: ``spawn_procs`` works again afterwards. Blocking; returns a
        future that is already done (``hosts.stop().get()`` works).
        :meth:`shutdown` stops the hosts too. Raises MeshUsageError on a slice;
        after ``shutdown()`` the future raises HostMeshShutDown, as Monarch's."""
        self._check_whole("stop()")
        if self._agents is not None and self._agents.shut_down:
            return failed(HostMeshShutDown("stop()"))
        from ._client import Controller

        controller = self._controller or Controller._default
        if controller is not None and not controller.loop.stopping:
            for group in list(controller.groups):
                if getattr(group, "agents", None) is self._agents and (
                    self._agents is None
                    or getattr(group, "boot_extras", {}).get("spawned_by") == self._owner
                ):
                    group.stop()
        return completed(None)

    def with_python_executable(self, python_executable: str) -> Any:
        """This host mesh, whose new processes run ``python_executable`` (a path, or
        a name on ``PATH``) instead of this interpreter. That interpreter must be
        able to import monarch_nb (and what your actors use). On this host a
        missing or non-executable path raises MeshUsageError at once; on other
        hosts the spawn fails, naming the rank, if it cannot start there."""
        if not isinstance(python_executable, str) or not python_executable:
            raise MeshUsageError(
                f"with_python_executable takes a path, e.g. '/usr/bin/python3'; "
                f"got {python_executable!r}"
            )
        if self._agents is None:
            import shutil

            found = shutil.which(python_executable)
            if found is None or not os.access(found, os.X_OK):
                raise MeshUsageError(
                    f"with_python_executable({python_executable!r}): no such executable on "
                    "this host; give the interpreter's full path"
                )
        return type(self)(
            self._controller,
            self._agents,
            shape=self._shape,
            python=python_executable,
            owner=self._owner,
        )

    def _boot_extras(
        self,
        bootstrap: Callable[[], Any] | None,
        proc_bind: Sequence[dict[str, str]] | None,
        per_host: int,
        command: tuple[Any, Mapping[str, int]] | None = None,
    ) -> dict[str, Any]:
        """What every worker of a new process mesh reads at start, checked here;
        ``command`` is ``spawn_procs``'s (bootstrap_command, per_host), if given."""
        extras: dict[str, Any] = {}
        if self._python is not None:
            extras["python"] = self._python
            # What the new processes' own this_host() runs (Monarch's rule: a
            # with_python_executable host mesh's processes spawn with it too).
            extras["host_python"] = self._python
        if self._agents is not None:
            extras["spawned_by"] = self._owner  # read by stop(); the workers ignore it
        if command is not None and command[0] is not None:
            from . import _bootstrap_command

            bootstrap_command, sizes = command
            if self._agents is not None:
                sizes = {"hosts": len(self._agents.agents), **sizes}
            shape = Shape(tuple(sizes), tuple(sizes.values()), range(_product(sizes)))
            extras.update(_bootstrap_command.boot_extras(bootstrap_command, shape))
        if proc_bind is not None:
            extras["proc_bind"] = check_proc_bind(proc_bind, per_host)
        if bootstrap is not None:
            if not callable(bootstrap):
                raise MeshUsageError(
                    f"bootstrap takes a function of no arguments, got {bootstrap!r}"
                )
            import cloudpickle

            try:
                extras["bootstrap"] = cloudpickle.dumps(bootstrap, protocol=5).hex()
            except Exception as exc:
                raise MeshUsageError(
                    f"bootstrap={bootstrap!r} cannot be pickled to send to the processes: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        return extras


# Process groups whose spawn_procs(bootstrap=fn) raised on a rank: that failure,
# for ProcMesh.initialized. Weak: it goes with the group.
_failed_bootstraps: weakref.WeakKeyDictionary[Any, MeshFailure] = weakref.WeakKeyDictionary()


def start_group(group: Any, bootstrap: Callable[[], Any] | None) -> None:
    """Start ``group``'s processes (blocking). A ``bootstrap`` that raised on a
    rank fails the mesh, not the spawn, as Monarch's: the failure is raised by
    ``procs.initialized`` and by the mesh's first use (no process is left
    running). Any other failure to start raises here, as before."""
    try:
        group.start()
    except MeshFailure as failure:
        if bootstrap is None or failure.cause != BOOTSTRAP_FAILED:
            raise
        _failed_bootstraps[group] = failure
        # The start killed the ranks that did start (stopped); the mesh is failed,
        # so its first use raises this failure, not "was stopped".
        group.controller.end_group(group, Failed(failure), failure)


def start_failure(group: Any) -> MeshFailure | None:
    """Why ``group``'s bootstrap failed at its start, or None."""
    return _failed_bootstraps.get(group)


def _product(sizes: Mapping[str, int]) -> int:
    total = 1
    for size in sizes.values():
        total *= size
    return total
