"""The meshes a notebook started, by name: the Python objects behind ``%mesh``.

A :class:`NotebookMesh` is a :class:`~monarch_nb.ProcMesh` (whose ``run``,
``exec``, ``push``, ``pull``, ``status`` are the plain-Python API behind
``%%mesh``) plus what a notebook adds: rank selection by ``--ranks`` /
``--where``, output routed to the cell that ran the code, torch.distributed
set up on start, and a name in the registry::

    from monarch_nb.magics import start_mesh, current_mesh

    mesh = start_mesh(procs=4, dist="gloo")
    mesh.run("x = rank * 2\\nx")            # ValueMesh {0: 0, 1: 2, ...}
    mesh.push(lr=0.1); mesh.pull("lr")
    trainers = mesh.spawn("trainer", Trainer)   # actors on the same processes
    current_mesh() is mesh                  # the last started is the default

No IPython here: the magics (``_extension``) only parse options and display.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from .._controller._actor_mesh import ActorMesh
from .._controller._calls import CallFuture
from .._controller._cells import run_cell
from .._controller._events import DisplayData, Output, RankFailed
from .._controller._interrupt import wait_for
from .._controller._proc_mesh import HostMesh, ProcMesh, this_host
from .._model._errors import MeshUsageError, StuckRanksKilled, format_ranks
from .._model._future import Future
from .._model._value_mesh import ValueMesh
from .._runtime._actors import Actor
from .._runtime._cell_source import compile_cell, next_cell_name
from .._services._config import collective_timeout
from .._services._dist import STORE_ENV, fresh_store_path
from .._services._logs import LogLine
from ..widgets import _render
from ..widgets._model import FailureLog
from ._comms import CommRelay
from ._figures import FIGURE_MODES
from ._output import CellOutput, MapProgress, OutputRouter
from ._replace import replace_stuck
from ._selection import select

A = TypeVar("A", bound=Actor)
DIST_BACKENDS = ("gloo", "nccl")
DIST_INIT_TIMEOUT_S = 120.0
_OUTPUT_SETTLE_S = 10.0  # the I/O thread writes out a finished cell's output in well under this


def deterministic_default() -> bool:
    """``MONARCH_NB_DETERMINISTIC=1``: every cell's output is ordered by rank."""
    return os.environ.get("MONARCH_NB_DETERMINISTIC", "").lower() in ("1", "true", "yes", "on")


class CellHandle:
    """A ``%%mesh --no-block`` cell in flight: ``.get()``, ``await``, ``.done()``.

    Its output keeps going to the cell that started it. ``.get()`` returns the
    ValueMesh of the last expression (or raises the cell's error).
    """

    def __init__(
        self, future: CallFuture, label: str, ranks: tuple[int, ...], cell: Any = None
    ) -> None:
        self.future, self.label, self.ranks = future, label, ranks
        self.cell = cell  # its CellOutput: where a stop says what it did

    def done(self) -> bool:
        return self.future.done()

    def get(self, timeout: float | None = None) -> ValueMesh[Any]:
        return self.future.get(timeout=timeout)

    def __await__(self):
        return self.future.__await__()

    def __repr__(self) -> str:
        if not self.future.done():
            state = "running"
        elif self.future.exception(timeout=0) is not None:
            state = f"failed: {type(self.future.exception(timeout=0)).__name__}"
        else:
            state = "done"
        return f"<{self.label} on ranks {format_ranks(self.ranks)}: {state}>"


class NotebookMesh:
    """A process mesh started from a notebook, with a rank namespace per process.

    ``.procs`` is the :class:`~monarch_nb.ProcMesh` itself: spawn actors on it
    (or with :meth:`spawn`) to mix actors and ``%%mesh`` cells on one set of
    processes.
    """

    def __init__(
        self,
        registry: MeshRegistry,
        procs: ProcMesh,
        *,
        dist: str | None,
        ordered: bool,
        hosts: HostMesh | None = None,
    ) -> None:
        self.registry = registry
        self.procs = procs
        self.hosts = hosts  # the multi-host mesh this notebook started for it, if any
        self.dist = dist
        self.ordered = ordered
        self._subscription = procs.events.subscribe(
            registry.router.on_event, kinds=(Output, DisplayData, RankFailed)
        )
        # Kept from the start, so a dashboard opened after a crash still lists it.
        self.failures = FailureLog()
        self._failure_subscription = procs.events.subscribe(self.failures, kinds=(RankFailed,))
        self._comms = CommRelay(procs)  # widgets made on ranks show in the notebook
        self._dashboards: list[Any] = []
        # --no-block cells still running: what the stop button and the panel stop.
        self.in_flight: set[CellHandle] = set()
        # After ranks get new processes (restart(ranks=...), a RestartPolicy), the
        # process group is set up again on every rank: the old one included the dead.
        procs.add_restart_hook(lambda ranks: self._setup_dist(again=True))

    @property
    def name(self) -> str:
        return self.procs.name

    @property
    def state(self) -> str:
        return self.procs.state

    def __len__(self) -> int:
        return len(self.procs)

    def __repr__(self) -> str:
        return f"<NotebookMesh {self.name!r} {len(self)} ranks {self.state}>"

    # -- cells ------------------------------------------------------------------------

    def run(
        self,
        source: str,
        *,
        ranks: str | list[int] | None = None,
        where: Any = None,
        timeout: float | None = None,
        block: bool = True,
        ordered: bool | None = None,
        fail_fast: bool = False,
        on_done: Any = None,
        number: int | None = None,
        replay: bool = True,
        figures: str = "arrival",
    ) -> ValueMesh[Any] | CellHandle:
        """Run ``source`` on the selected ranks (default: all); its last expression's values.

        Raises SyntaxError locally before anything is sent. With ``block=False``
        returns a :class:`CellHandle` at once. Output streams to the current
        cell while it runs (ordered by rank if ``ordered``), and a rank that
        raises is named there at once. An interrupt or ``timeout`` stops the
        busy ranks (see :func:`wait_for`); so does the first failure with
        ``fail_fast``. A CellError keeps the succeeded ranks' values (``.values``).
        ``number`` names the cell ``<mesh-cell-number>`` (the notebook's execution
        count; default: the next of a process-wide count). ``figures``: "arrival"
        (as they come), "rank" (held, then in rank order) or "grid" (held, then
        one grid captioned by rank).
        """
        if figures not in FIGURE_MODES:
            raise MeshUsageError(
                f"figures={figures!r}: use one of {', '.join(map(repr, FIGURE_MODES))}"
            )
        view = select(self.procs, ranks, where)
        _, filename = next_cell_name(number)
        compile_cell(source, filename)  # SyntaxError here, with the cell's own line numbers
        label = _render.cell_label(filename)
        cell = self._open(view, label, ordered)
        cell.fail_fast = fail_fast
        cell.figures = figures
        future = view.exec(source, name=filename, fail_fast=fail_fast, replay=replay)
        cell.attach(future)
        finished = self._finish_after_output(future, cell, on_done)
        if not block:
            handle = CellHandle(future, label, view.shape.ranks, cell)
            self.in_flight.add(handle)
            future.add_done_callback(lambda _: self.in_flight.discard(handle))
            return handle
        try:
            return wait_for(future, timeout=timeout)
        except StuckRanksKilled as exc:
            # Killed after the grace: replaced at once, so the mesh is usable again.
            raise replace_stuck(self, exc) from None
        finally:
            if future.done():
                finished.wait(_OUTPUT_SETTLE_S)

    def push(
        self, values: Mapping[str, Any] | None = None, /, *, ranks=None, where=None, **kw: Any
    ) -> None:
        """Set names in the selected ranks' namespaces: ``mesh.push(lr=0.1)``."""
        select(self.procs, ranks, where).push({**(values or {}), **kw})

    def pull(self, name: str, *, ranks=None, where=None) -> ValueMesh[Any]:
        """``name`` from every selected rank's namespace, as a ValueMesh."""
        return select(self.procs, ranks, where).pull(name)

    def logs(self, *, ranks=None, where=None, **filters: Any) -> list[LogLine]:
        """The selected ranks' log lines (see ProcMesh.logs: grep, since, level, tail)."""
        return select(self.procs, ranks, where).logs(**filters)

    def scatter(self, name: str, seq: Any, *, ranks=None, where=None) -> None:
        """Each selected rank gets its contiguous chunk of ``seq`` as ``name``
        (see ProcMesh.scatter)."""
        select(self.procs, ranks, where).scatter(name, seq)

    def gather(self, name: str, *, ranks=None, where=None) -> Any:
        """``name`` from the selected ranks, concatenated in rank order
        (see ProcMesh.gather)."""
        return select(self.procs, ranks, where).gather(name)

    def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        ranks=None,
        where=None,
        in_flight: int = 2,
    ) -> list[Any]:
        """``fn(item)`` for every item, load-balanced over the selected ranks; the
        results in input order (see ProcMesh.map), with a progress line in the
        cell while it runs (not in deterministic mode). Ctrl-C stops sending items."""
        future = select(self.procs, ranks, where).map(fn, items, in_flight=in_flight)
        if self.ordered or deterministic_default():
            return future.get()
        progress = MapProgress(self.registry.router.frontend)
        future.on_progress = progress.update
        progress.update(*future.progress)
        try:
            return future.get()
        finally:
            progress.update(*future.progress, final=True)

    def _open(self, view: ProcMesh, label: str, ordered: bool | None) -> CellOutput:
        if ordered is None:
            ordered = self.ordered or deterministic_default()
        return self.registry.router.open(
            self.name,
            view.shape.ranks,
            label=label,
            ordered=ordered,
            option=self.procs.output_option,
        )

    def _finish_after_output(
        self, future: Future[Any], cell: CellOutput, on_done: Any
    ) -> threading.Event:
        def close() -> None:
            cell.close()
            if on_done is not None:
                on_done(future, cell)

        # After the output the ranks wrote before replying: see EventStream.after_received.
        future.add_done_callback(lambda _: self.procs.events.after_received(close))
        return cell.closed

    # -- actors, life cycle -------------------------------------------------------------

    def spawn(self, name: str, actor_class: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Start an actor on every process of this mesh (see ProcMesh.spawn)."""
        return self.procs.spawn(name, actor_class, *args, **kwargs)

    def stop(self) -> None:
        """Stop the processes and forget this mesh."""
        try:
            self.procs.stop()
            if self.hosts is not None:
                self.hosts.shutdown()
        finally:
            self._subscription.close()
            self._failure_subscription.close()
            self._comms.close()
            for dashboard in self._dashboards:
                dashboard.finish()  # its last picture: every rank stopped
            self._dashboards.clear()
            self.registry._forget(self)

    def restart(
        self, ranks: str | list[int] | None = None, *, replay: bool = False, **replaying: Any
    ) -> Any:
        """Fresh processes; torch.distributed is set up again on every rank.

        Without ``ranks`` every process is replaced (empty namespaces, actors to
        spawn again); with ``ranks`` (``"1"``, ``[1, 3]``) only those, and the
        other ranks keep their namespaces and actors. Returns the RestartRecord.
        ``replaying``: ``on_step`` and ``skip`` of ProcMesh.restart (see ``_quiet_replay``).
        """
        if ranks is None:
            return self.procs.restart(replay=replay, **replaying)
        chosen = select(self.procs, ranks, None).shape.ranks
        return self.procs.restart(ranks=chosen, replay=replay, **replaying)

    def resize(self, procs: int) -> ProcMesh:
        """Go on with the first ``procs`` live ranks, renumbered 0..procs-1 (see
        ProcMesh.resize); cells, ``%mesh`` commands and the dashboard follow the
        new mesh, and torch.distributed is set up again at the new size.
        Returns the new ProcMesh (also ``.procs``)."""
        return self._follow(self.procs.resize(procs))

    def grow(self, count: int) -> ProcMesh:
        """Add ``count`` ranks after the live ones (see ProcMesh.grow), as :meth:`resize`
        follows the new mesh. Returns the new ProcMesh (also ``.procs``)."""
        return self._follow(self.procs.grow(count))

    def _follow(self, procs: ProcMesh) -> ProcMesh:
        # The event stream is the old mesh's (shared), so the subscriptions go on;
        # failures were numbered by the old ranks, so they are forgotten.
        self.procs = procs
        self.failures.clear()
        self._comms.close()  # the old ranks' widgets went with them
        self._comms = CommRelay(procs)
        self._setup_dist(again=True)
        return procs

    def interrupt(self) -> list[int]:
        """KeyboardInterrupt in every busy rank; returns those ranks."""
        busy = self.procs.busy_ranks()
        self.procs.interrupt(busy)
        return busy

    def dashboard(self) -> Any:
        """The live dashboard of this mesh (display it, or make it a cell's last line).

        A tile per rank (state, work, resources, heartbeat), failures as they
        happen and a rank's last output; updated while cells run. Where no
        widget front end exists (plain IPython, nbval) it shows as text.
        """
        from ..widgets._dashboard import show_dashboard

        dashboard = show_dashboard(self)
        self._dashboards = [d for d in self._dashboards if not d.finished] + [dashboard]
        return dashboard

    def _free_master_port(self) -> int:
        """A port free on rank 0's host (where the process group's store listens)."""
        first = self.procs.slice(**dict.fromkeys(self.procs.shape.labels, 0))
        # One expression: nothing is left in rank 0's namespace.
        source = "__import__('monarch_nb._wire._network', fromlist=['_']).free_port()"
        probe = run_cell(first, source, record=False)  # not a step of the user's history
        return int(wait_for(probe, timeout=DIST_INIT_TIMEOUT_S).values()[0])

    def status(self) -> _render.NotebookMeshStatus:
        """A snapshot (``ProcMesh.status()``) with what the notebook adds: the
        torch.distributed backend and whether this is the default mesh."""
        return _render.NotebookMeshStatus(
            self.procs.status(), self.dist, self.registry.default is self
        )

    # -- internals ------------------------------------------------------------------------

    def _setup_dist(self, again: bool = False) -> None:
        if self.dist is None:
            return
        # Device first for NCCL: each rank sees one GPU (CUDA_VISIBLE_DEVICES), cuda:0.
        # Again (after some ranks restarted): the survivors leave the old group,
        # and every rank meets at a fresh port, since the old store may live on.
        fresh = (
            "if dist.is_initialized():\n"
            "    dist.destroy_process_group()\n"
            f"os.environ['MASTER_PORT'] = {str(self._free_master_port())!r}\n"
            # ... or a fresh file, on one host (see monarch_nb._services._dist).
            f"if os.environ.get({STORE_ENV!r}):\n"
            f"    os.environ[{STORE_ENV!r}] = {fresh_store_path()!r}\n"
            if again
            else ""
        )
        source = (
            "import datetime, os, torch, torch.distributed as dist\n"
            f"if {self.dist!r} == 'nccl':\n"
            "    torch.cuda.set_device(0)\n"
            f"{fresh}"
            "from monarch_nb._services._dist import init_process_group\n"
            "if not dist.is_initialized():\n"
            f"    init_process_group({self.dist!r}, "
            f"timeout=datetime.timedelta(seconds={collective_timeout()!r}))\n"
        )
        view = self.procs
        cell = self._open(view, f"torch.distributed setup ({self.dist})", None)
        # Not a step of the history: a restart runs it again by itself, before a replay.
        future = run_cell(view, source, name=f"<mesh-{self.name}-dist-setup>", record=False)
        finished = self._finish_after_output(future, cell, None)
        try:
            wait_for(future, timeout=DIST_INIT_TIMEOUT_S)
        finally:
            if future.done():
                finished.wait(_OUTPUT_SETTLE_S)


class MeshRegistry:
    """The meshes started through the notebook layer, by name; the last is the default."""

    def __init__(self) -> None:
        self.router = OutputRouter()
        self._meshes: dict[str, NotebookMesh] = {}
        self.default: NotebookMesh | None = None

    def start(
        self,
        *,
        procs: int | None = None,
        gpus: int | None = None,
        dist: str | None = None,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        ordered: bool = False,
        hosts: Callable[[], HostMesh] | None = None,
        force: bool = False,
    ) -> NotebookMesh:
        """Start a mesh of ``procs`` CPU ranks or ``gpus`` GPU ranks on this host, or
        per host of what ``hosts()`` starts (``--ssh``, ``--slurm``, ``--attach``);
        ``force``: past the sanity limit of ranks per CPU (``--force``)."""
        if procs is not None and gpus is not None:
            raise MeshUsageError("give procs or gpus, not both")
        if dist is not None and dist not in DIST_BACKENDS:
            raise MeshUsageError(f"dist must be one of {DIST_BACKENDS!r}, got {dist!r}")
        name = name or self._free_name()
        existing = self._meshes.get(name)
        if existing is not None and existing.state != "stopped":
            raise MeshUsageError(
                f"a mesh named {name!r} is already {existing.state}; stop it first "
                "or choose another name"
            )
        per_host = {"gpus": gpus} if gpus is not None else {"procs": procs or 2}
        host_mesh = hosts() if hosts is not None else None
        try:
            procs_mesh = (host_mesh or this_host()).spawn_procs(
                per_host=per_host, env=dict(env or {}), name=name, echo_output=False, force=force
            )
        except BaseException:
            if host_mesh is not None:
                host_mesh.shutdown()
            raise
        mesh = NotebookMesh(self, procs_mesh, dist=dist, ordered=ordered, hosts=host_mesh)
        self._meshes[name] = mesh
        self.default = mesh
        try:
            mesh._setup_dist()
        except BaseException:
            mesh.stop()
            raise
        return mesh

    def _free_name(self) -> str:
        if "mesh" not in self._meshes:
            return "mesh"
        return next(f"mesh{i}" for i in itertools.count(2) if f"mesh{i}" not in self._meshes)

    def get(self, name: str | None = None) -> NotebookMesh:
        """The mesh called ``name``, or the default (last started) one."""
        if name is None:
            if self.default is None:
                raise MeshUsageError("no mesh is running; start one with %mesh start --procs 4")
            return self.default
        try:
            return self._meshes[name]
        except KeyError:
            known = ", ".join(repr(n) for n in self._meshes) or "none"
            raise MeshUsageError(f"no mesh named {name!r}; running meshes: {known}") from None

    def all(self) -> list[NotebookMesh]:
        return list(self._meshes.values())

    def stop_all(self) -> None:
        """Stop every mesh (extension unload, kernel shutdown)."""
        for mesh in list(self._meshes.values()):
            mesh.stop()

    def _forget(self, mesh: NotebookMesh) -> None:
        if self._meshes.get(mesh.name) is mesh:
            del self._meshes[mesh.name]
        if self.default is mesh:
            self.default = next(reversed(self._meshes.values()), None)


REGISTRY = MeshRegistry()


def current_mesh(name: str | None = None) -> NotebookMesh:
    """The mesh ``%%mesh`` runs on by default (the last started), or the one called ``name``."""
    return REGISTRY.get(name)


def start_mesh(**options: Any) -> NotebookMesh:
    """What ``%mesh start`` does: ``start_mesh(procs=4, dist="gloo", name="m")``."""
    return REGISTRY.start(**options)
