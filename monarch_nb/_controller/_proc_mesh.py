"""Process meshes (views over a group of worker processes) and hosts."""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from .._model import _checks
from .._model._errors import MeshFailure, MeshUsageError, SpawnError
from .._model._future import Future, completed, done_as_none, failed
from .._model._public import publish
from .._model._shape import MeshShape, Point, Shape
from .._model._value_mesh import ValueMesh
from .._runtime import _context, _owned, _refs
from .._runtime._actors import Actor, check_endpoint_kinds
from .._runtime._balance import MapFuture
from .._runtime._peer_mesh import rebuild_procs
from .._runtime._tensor_link import tensor_engine
from .._services import _interpreter
from .._wire._messages import Spawn
from . import _cells, _data_parallel, _workspace_sync
from ._actor_mesh import ActorMesh, unpicklable_argument
from ._calls import CallFuture, send_call
from ._client import Controller
from ._events import EventStream, Output, RankState
from ._group_status import mesh_state
from ._history import History
from ._host_mesh_extras import HostMeshBase, HostMeshShutDown, start_failure, start_group
from ._interrupt import wait_for
from ._lifecycle import Failed, SpawnRecord
from ._log_stream import OutputPrinter
from ._observation import MeshObservation
from ._process_group import ProcGroup, check_gpus
from ._recovery import RestartPolicy
from ._status import MeshState, RestartRecord
from ._workspace_sync import WorkspaceCopy

A = TypeVar("A", bound=Actor)
_actor_ids = itertools.count(1)
# A sanity limit on processes per host: far beyond it is a typo, not a plan.
MAX_PROCS_PER_CPU = 64


class ProcMesh(MeshObservation, MeshShape):
    """A mesh of worker processes. Views made by :meth:`slice` share the processes.

    Start one with ``this_host().spawn_procs(per_host={"procs": 4})``; use it as
    a context manager (``with`` or ``async with``) to stop it at the end.

    Its shape reads as every mesh's: ``extent``, ``size(dim)``, ``sizes``,
    ``to_table()``; ``slice``, ``flatten``, ``split`` and ``rename`` make views.
    What it tells about its ranks (``status``, ``stacks``, ``diagnose``,
    ``timeline``, ``telemetry``, ``logs``, ...) comes from :class:`MeshObservation`.
    """

    def __init__(self, group: ProcGroup, shape: Shape) -> None:
        self._group = group
        self._shape = shape

    @property
    def initialized(self) -> Future[Literal[True]]:
        """A future of True: already done, since ``spawn_procs`` returns once the
        processes are up (Monarch's ``await procs.initialized``); it raises the
        MeshFailure if ``spawn_procs(bootstrap=fn)``'s ``fn`` raised on a rank."""
        failure = start_failure(self._group)
        return completed(True) if failure is None else failed(failure)

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

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._group, shape)

    def activate(self) -> Any:
        """Run torch on this mesh: inside ``with procs.activate():`` factory functions
        and ops on mesh tensors run on every rank, and return
        :class:`~monarch_nb.MeshTensor` handles (see docs/tensor.md).
        """
        self._check_current("activate")
        return tensor_engine().activate(self)

    def point_of_rank(self, rank: int) -> Point:
        return self._shape.point_of_rank(rank)

    def rank_of_point(self, point: Mapping[str, int]) -> int:
        return self._shape.rank_of_point(point)

    # -- state and observation -------------------------------------------------------

    @property
    def state(self) -> MeshState:
        """``starting``, ``running``, ``failed`` or ``stopped`` (a str enum), for the
        ranks of this view: failed if one of them is dead, while a view without the
        dead ranks is still running."""
        return mesh_state(self._group, self._shape.ranks)[0]

    @property
    def failure(self) -> MeshFailure | None:
        """Why the mesh, or a rank of this view, failed; None if none did."""
        state = self._group.state
        if isinstance(state, Failed):
            return state.error
        return self._group.rank_failure(self._shape.ranks)

    def healthy(self) -> ProcMesh:
        """The view of this one's ranks that are alive (neither dead nor restarting).

        ``procs.healthy().run(...)`` and ``actors.slice(...)`` over it keep
        working while a dead rank waits for :meth:`restart`. A one-dimensional
        view keeps its dimension (``procs.healthy()`` is ``procs.slice(procs=[0,
        2, 3])`` when rank 1 died); a view of several dimensions becomes one
        dimension, ``ranks``, over the live ranks. Raises MeshFailure if none is
        alive.
        """
        shape = self._shape
        live = self._group.live_ranks(shape.ranks)
        if len(live) == len(shape):
            return self
        if not live:
            raise self.failure or MeshFailure(
                f"no rank of process mesh {self.name!r} {shape!r} is alive", ranks=shape.ranks
            )
        if len(shape.labels) == 1:
            indices = [shape.index_of_rank(r) for r in live]
            return ProcMesh(self._group, shape.slice(**{shape.labels[0]: indices}))
        return ProcMesh(self._group, Shape(("ranks",), (len(live),), live))

    @property
    def pids(self) -> list[int]:
        return [self._group.workers[r].pid for r in self._shape.ranks]

    @property
    def events(self) -> EventStream:
        """The mesh's event stream (shared by every view): ``procs.events.subscribe(fn)``."""
        return self._group.events

    def busy_ranks(self) -> list[int]:
        """Ranks of this view running something: calls or cells in flight, or (by
        their heartbeat) a broadcast or a call whose future was cancelled."""
        active = (RankState.BUSY, RankState.PAUSED)
        return [r for r in self._shape.ranks if self._group.rank_state(r) in active]

    def interrupt(self, ranks: Iterable[int] | None = None) -> list[int]:
        """Raise KeyboardInterrupt in whatever user code runs on ``ranks`` (default:
        :meth:`busy_ranks`); returns the ranks interrupted. Python code stops at
        its next bytecode (a sleep or a blocking read is broken too); code stuck
        in C holding the GIL does not, see :meth:`kill`. To stop one call only
        (queued or running), use its future's ``interrupt()``.
        """
        self._check_current("interrupt")
        targets = self.busy_ranks() if ranks is None else list(ranks)
        self._group.interrupt(targets)
        return targets

    def kill(self, ranks: Iterable[int]) -> None:
        """Kill ``ranks`` with SIGKILL (a rank stuck in C ignores interrupts).

        Those ranks are then dead: calls that include them fail, naming them,
        until :meth:`restart` (the other ranks, :meth:`healthy`, go on).
        """
        self._check_current("kill")
        self._group.kill_ranks(ranks)

    # -- code cells: the plain-Python API behind %%mesh ---------------------------------

    def exec(
        self,
        source: str,
        *,
        name: str | None = None,
        fail_fast: bool = False,
        replay: bool = True,
    ) -> CallFuture:
        """Start ``source`` on every rank of this view; a future of the last expression's
        values (a ValueMesh). Raises SyntaxError locally, before anything is sent.

        Each rank keeps one namespace across cells, with ``rank``, ``world_size``,
        ``local_rank``, ``point`` and ``display`` predefined. With ``fail_fast``
        the first rank that raises interrupts the others (and kills those stuck
        outside Python after the grace period). With ``replay=False`` the cell
        is left out of what ``restart(replay=True)`` runs again.
        """
        self._check_current("exec")
        return _cells.run_cell(self, source, name=name, fail_fast=fail_fast, replay=replay)

    def run(
        self, source: str, *, timeout: float | None = None, fail_fast: bool = False
    ) -> ValueMesh[Any]:
        """Run ``source`` on every rank and wait: the ValueMesh of its last expression.

        On ``timeout`` (or Ctrl-C) the ranks still running are interrupted, and
        killed if they do not stop within the grace period. Raises CellError with
        every rank's traceback if it raised; its ``.values`` hold the values of
        the ranks that succeeded. ``timeout`` is seconds >= 0, or None (or
        ``math.inf``) for no limit; anything else raises MeshUsageError before
        the cell is sent.
        """
        timeout = _checks.timeout(timeout, "run")
        return wait_for(self.exec(source, fail_fast=fail_fast), timeout=timeout)

    def push(self, values: Mapping[str, Any] | None = None, /, **names: Any) -> None:
        """Set names in every rank's namespace: ``procs.push(lr=0.1)``."""
        self._check_current("push")
        wait_for(_cells.push(self, {**(values or {}), **names}))

    def pull(self, name: str) -> ValueMesh[Any]:
        """``name`` from every rank's namespace, as a ValueMesh."""
        self._check_current("pull")
        return wait_for(_cells.pull(self, name))

    # -- data parallel: see _data_parallel ----------------------------------------------

    def scatter(self, name: str, seq: Any) -> None:
        """Split ``seq`` (a list, tuple, string, tensor or array) into one contiguous
        chunk per rank, in rank order, and set ``name`` to it on each rank:
        ``procs.scatter("shard", list(range(10)))``."""
        self._check_current("scatter")
        _data_parallel.scatter(self, name, seq)

    def gather(self, name: str) -> Any:
        """``name`` from every rank, concatenated in rank order (lists, tuples and
        strings joined, tensors and arrays concatenated); other values as a list."""
        self._check_current("gather")
        return _data_parallel.gather(self, name)

    def map(
        self, fn: Callable[[Any], Any], items: Iterable[Any], *, in_flight: int = 2
    ) -> MapFuture:
        """``fn(item)`` for every item, load-balanced over the ranks: each rank runs at
        most ``in_flight`` items at a time and gets the next as soon as one
        finishes. A future of the results in input order:
        ``procs.map(score, batches).get()``. ``fn`` travels with each item, so
        keep large data on the ranks (``scatter`` it) rather than in ``fn``.
        """
        self._check_current("map")
        return _data_parallel.map_items(self, fn, items, in_flight=in_flight)

    # -- actors ---------------------------------------------------------------------

    def spawn(self, name: str, actor_class: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Start one ``actor_class(*args, **kwargs)`` in every process of this mesh.

        Returns at once, as Monarch's does: each rank runs ``__init__`` in the
        background, and calls made meanwhile wait behind it there, so
        ``procs.spawn("c", Counter).add.call(1).get()`` just works. If
        ``__init__`` raises on a rank, calls to the mesh raise that error (a
        SpawnError, with the rank and the remote traceback; the process mesh
        stays usable), and so does ``actors.initialized.get()``, the way to wait
        for construction itself. ``name`` labels the actors in log lines and
        tracebacks: a non-empty string of printable characters without ``/``,
        ``[`` or ``]`` (else MeshUsageError). Raises at once MeshFailure if the
        mesh is failed, SerializationError if the arguments cannot be pickled.
        """
        self._check_current("spawn")
        _checks.actor_name(name)
        if not (isinstance(actor_class, type) and issubclass(actor_class, Actor)):
            raise MeshUsageError(
                f"spawn({name!r}, ...) needs a subclass of monarch_nb.Actor, got {actor_class!r}"
            )
        check_endpoint_kinds(actor_class)
        group = self._group
        shape = self._shape
        actor_id = next(_actor_ids)
        call = send_call(
            group,
            shape,
            lambda call_id: Spawn(call_id, actor_id, name, shape.labels, shape.sizes, shape.ranks),
            (actor_class, args, kwargs),
            actor=f"{actor_class.__name__} {name!r}",
            error_class=SpawnError,
            check=lambda: group.failure_for(shape.ranks),
            encode_error=lambda exc: unpicklable_argument(
                f"{actor_class.__name__}.__init__", args, kwargs, exc
            ),
        )
        if call.group is None:  # never sent (a failed mesh, an unpicklable argument): say it now
            call.get()
        record = SpawnRecord(
            name, actor_class, args, kwargs, shape.labels, shape.sizes, shape.ranks
        )
        group.spawned[actor_id] = record
        step = group.history.record(
            "spawn", f"spawn {name} ({actor_class.__name__})", shape, (actor_id, record)
        )
        group.history.watch(step, call.future)
        call.future.add_done_callback(
            lambda future: _spawn_settled(group, actor_id, record, future)
        )
        actors = ActorMesh(
            self,
            shape,
            actor_id=actor_id,
            name=name,
            cls=actor_class,
            generation=group.generation,
            initialized=done_as_none(call.future),
        )
        _owned.own(actors)  # an actor's: stopped when it is
        return actors

    # -- life cycle -----------------------------------------------------------------

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every process of this mesh (all views), waiting for them to exit.

        Returns once they have exited, with a future that is already done, so
        Monarch's ``procs.stop().get()`` and ``await procs.stop()`` work as well
        as a plain ``procs.stop()``. (``reason`` is accepted as Monarch's is.)
        """
        self._group.stop()
        if self._group.printer is not None:
            self._group.printer.flush()
        return completed(None)

    def restart(
        self,
        ranks: Iterable[int] | None = None,
        *,
        replay: bool = False,
        on_step: Any = None,
        skip: Any = None,
    ) -> RestartRecord:
        """Replace processes with fresh ones (blocking); returns what was done.

        ``restart()`` replaces every process: namespaces start empty and actor
        meshes must be spawned again. ``restart(ranks=[1])`` replaces only those
        processes (dead or alive): the other ranks keep their namespaces and
        actors, and the actors that lived on rank 1 are spawned again there with
        the arguments they were first given (the record names any that could
        not be: spawn those again yourself). Raises MeshFailure if a new
        process does not start.

        ``replay=True`` then sends the :meth:`history` again to the new
        processes, in order: the pushes, cells and spawns that succeeded (cells
        run with ``replay=False`` left out), each to the part of its view that
        restarted; actor meshes spawned again this way keep working through
        the handles you hold. A step that fails stops the replay with a
        ReplayError naming it. Without replay, a restart of every rank starts
        the history over. ``on_step(i, n, step)`` is told of each step before it
        is sent, and ``skip(step)`` true leaves one out (see ``_replay.replay``).
        """
        from ._replay import replay as replay_history

        self._check_current("restart")
        record = self._group.restart(ranks)
        if replay:
            sent = replay_history(
                self, record.ranks, spawns=ranks is None, on_step=on_step, skip=skip
            )
            return dataclasses.replace(record, replayed=sent)
        if ranks is None:
            self._group.history.clear()
        return record

    def resize(self, procs: int) -> ProcMesh:
        """A new, smaller mesh over this one's running processes: after a failure,
        ``procs.resize(procs=3)`` keeps the first 3 live ranks, renumbered 0-2
        (the others are stopped). Blocking.

        Each kept process keeps its namespace; its ``rank``, ``world_size``,
        ``point``, ``current_rank()`` and its ``RANK``, ``WORLD_SIZE`` and
        ``LOCAL_RANK`` variables are the new ones, and ``MASTER_PORT`` is a
        fresh port. A kept rank leaves its torch.distributed process group
        (made for the old world): call ``dist.init_process_group()`` again.
        This mesh is left stopped (``resized into`` the new one); its actor
        meshes are stopped too: spawn them again on the new mesh. The new mesh
        starts an empty :meth:`history` and keeps the restart hooks and
        policy. Raises MeshUsageError if ``procs`` is more than the live
        ranks (use :meth:`grow`), or for a mesh on several hosts.
        """
        from ._resize import resize

        self._check_current("resize")
        new = resize(self._group, procs)
        return ProcMesh(new, new.shape)

    def grow(self, count: int) -> ProcMesh:
        """A new mesh of this one's live ranks followed by ``count`` new processes
        (ranks ``n .. n+count-1``, with empty namespaces), as :meth:`resize`
        makes; ``procs.grow(1)``. Blocking; raises MeshFailure if a new process
        does not start (the new mesh is stopped then)."""
        from ._resize import grow

        self._check_current("grow")
        new = grow(self._group, count)
        return ProcMesh(new, new.shape)

    def _check_current(self, method: str) -> None:
        resized_into = self._group.resized_into
        if resized_into is not None:
            raise MeshUsageError(
                f"{method}() on process mesh {self.name!r}, which was resized into "
                f"{resized_into}: use the mesh that resize() or grow() returned"
            )

    def history(self) -> History:
        """The pushes, cells and spawns sent to this mesh (every view of it) since it
        started or last restarted without replay, in order, with how each ended:
        what ``restart(replay=True)`` sends again. ``print(procs.history())``."""
        return self._group.history

    def add_restart_hook(self, hook: Callable[[tuple[int, ...]], None]) -> None:
        """Call ``hook(ranks)`` each time processes of this mesh are replaced
        (``restart()``, ``restart(ranks=...)``, a RestartPolicy), once they are up
        and their actors spawned again, before ``restart()`` returns: set up what
        every rank needs again (a torch.distributed process group, say)."""
        self._check_current("add_restart_hook")
        self._group.after_restart.append(hook)

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()

    def __reduce__(self):
        ref = self._group.ref()
        if ref is None:
            raise MeshUsageError(
                f"process mesh {self.name!r} runs on several hosts: passing it to an actor is "
                "not supported yet for meshes started through host agents; keep it on the "
                "controller"
            )
        _refs.register_procs(ref, self._group, ProcMesh)
        return (rebuild_procs, (ref, _refs.ViewRef.of(self._shape)))


class HostMesh(HostMeshBase):
    """The hosts processes can be started on: ``this_host()``, or a multi-host mesh
    from :func:`~monarch_nb.ssh_hosts`, :func:`~monarch_nb.slurm_hosts` or
    :func:`~monarch_nb.attach` (one agent per host). Stop a multi-host one with
    :meth:`shutdown`, or use it as a context manager. One dimension, ``hosts``:
    ``extent``, ``slice(hosts=...)``, ``initialized``, ``stop()`` and
    ``with_python_executable()`` come from :class:`HostMeshBase`.
    """

    def __repr__(self) -> str:
        return f"<HostMesh {self.hosts}>"

    def __reduce__(self):
        # This host travels as "the host of whoever receives it": an actor that
        # spawns processes on it owns them (their supervisor), as in Monarch.
        if self._agents is None:
            return (_this_host_of, (socket.gethostname(),))
        raise MeshUsageError(
            f"host mesh {self.hosts} is driven by its agents from this controller: "
            "spawn the processes here and pass the ProcMesh to the actor instead"
        )

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        name: str = "procs",
        echo_output: bool = True,
        force: bool = False,
        restart: RestartPolicy | None = None,
        bootstrap: Callable[[], Any] | None = None,
        proc_bind: Sequence[dict[str, str]] | None = None,
        bootstrap_command: Any = None,
    ) -> ProcMesh:
        """Start worker processes: ``per_host={"procs": 4}`` or ``{"gpus": 4}``.

        ``{"gpus": N}`` gives each rank one GPU through ``CUDA_VISIBLE_DEVICES``
        and fails at once if the host has fewer. Every worker gets ``RANK``,
        ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
        ``MASTER_PORT`` (a free port), so ``torch.distributed.init_process_group``
        needs no arguments; on one host ``MASTER_ADDR`` is 127.0.0.1 and torch's
        store and gloo's sockets listen on loopback only (``GLOO_SOCKET_IFNAME``
        unless ``env`` or the environment sets it). ``env`` adds variables.
        With ``echo_output`` (the default) what ranks print is printed here,
        prefixed by rank; without it, subscribe to ``procs.events`` for
        :class:`~monarch_nb.events.Output`.

        On a multi-host mesh the dimensions are ``("hosts", *per_host)``, ranks
        are numbered host by host, and ``MASTER_ADDR`` is the first host's.
        More than ``MAX_PROCS_PER_CPU`` processes per CPU on a host is refused
        as a likely typo unless ``force=True``.
        ``restart=RestartPolicy(max_restarts=3, window_s=60, ranks="failed")``
        brings dead ranks back by itself (see :class:`~monarch_nb.RestartPolicy`).
        ``bootstrap``: a function (or async function) of no arguments each new
        process runs first, before any actor or cell (set variables before CUDA
        starts); if it raises, the mesh fails, not the spawn (as Monarch's):
        ``initialized`` and the first use raise MeshFailure naming the rank,
        with its traceback. ``proc_bind``: CPU affinity, one dict per process of
        a host, as Monarch's: ``[{"cpus": "0-3"}, {"cpus": "4-7"}]`` (also
        ``physcpubind``, ``cpunodebind``); see docs/hosts.md. ``bootstrap_command``:
        Monarch's (``default_bootstrap_cmd().with_env({...})``, or a function of
        the point returning one): its program and environment start each process.
        """
        if not isinstance(per_host, Mapping | None):
            raise MeshUsageError(
                f"per_host must be a dict of dimension sizes, e.g. per_host={{'procs': 4}}; "
                f"got {per_host!r}"
            )
        if restart is not None and not isinstance(restart, RestartPolicy):
            raise MeshUsageError(f"restart= takes a RestartPolicy, got {restart!r}")
        per_host = dict(per_host or {"procs": 1})
        for dim, size in per_host.items():
            if (
                not isinstance(dim, str)
                or not isinstance(size, int)
                or isinstance(size, bool)
                or size < 1
            ):
                raise MeshUsageError(
                    f"per_host must map dimension names to positive ints, got {dim!r}: {size!r}"
                )
        per_host_total = 1
        for size in per_host.values():
            per_host_total *= size
        limit = MAX_PROCS_PER_CPU * (os.cpu_count() or 1)
        if per_host_total > limit and not force:
            raise MeshUsageError(
                f"spawn_procs(per_host={per_host!r}) starts {per_host_total} processes per "
                f"host, more than {MAX_PROCS_PER_CPU} per CPU here ({limit}); if you mean "
                "it, pass force=True (in a notebook: %mesh start --force)"
            )
        if not isinstance(name, str) or not name:
            raise MeshUsageError(f"name must be a non-empty str, got {name!r}")
        gpus = "gpus" in per_host
        if env is not None:
            bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
            if bad:
                raise MeshUsageError(f"env values must be strings; {bad[0]!r} is not")
        self._check_whole("spawn_procs()")
        boot_extras = self._boot_extras(
            bootstrap, proc_bind, per_host_total, command=(bootstrap_command, per_host)
        )
        agents = self._agents
        if agents is None:
            if gpus:
                gpus = check_gpus(per_host["gpus"])
            sizes = per_host
        else:
            if "hosts" in per_host:
                raise MeshUsageError('per_host cannot name a "hosts" dimension: it is the hosts')
            if agents.shut_down:
                raise HostMeshShutDown("spawn_procs()")
            if gpus:
                without = [agent.label for agent in agents.agents if not agent.gpus]
                if without and len(without) < len(agents.agents):
                    raise MeshUsageError(
                        f"per_host={{'gpus': {per_host['gpus']}}}: host(s) {', '.join(without)} "
                        "have no GPU visible and the others do; use hosts of one kind"
                    )
                # Every host without one: CPU ranks (said once), as on one host.
                gpus = all(
                    check_gpus(per_host["gpus"], agent.gpus, f"host {agent.label}")
                    for agent in agents.agents
                )
            sizes = {"hosts": len(agents.agents), **per_host}
        controller = self._controller or Controller.get()
        group = ProcGroup(
            sizes,
            controller=controller,
            env=env,
            gpus=gpus,
            name=name,
            agents=agents,
            restart=restart,
        )
        group.boot_extras = boot_extras
        if echo_output:
            group.printer = OutputPrinter()
            group.events.subscribe(group.printer, kinds=(Output,))
        start_group(group, bootstrap)  # a bootstrap's failure: at initialized, as Monarch's
        procs = ProcMesh(group, group.shape)
        _owned.own(procs)  # an actor's: stopped when it is
        return procs

    def sync_workspace(
        self,
        paths: str | Sequence[str] | None = None,
        *,
        dest: str | None = None,
        on_path: bool = True,
        compress: bool = False,
        transport: str = "auto",
        timeout: float = 300.0,
    ) -> list[WorkspaceCopy]:
        """Copy a workspace to every host, for hosts that share no file system
        with this one (Monarch's ``sync_workspace``).

        ``paths``: directories (their contents) and files to send; default the
        current directory (a notebook's own). ``dest``: where they go on each
        host (default ``~/.monarch_nb/workspace/<name of the first path>``).
        With ``on_path`` the processes spawned on these hosts afterwards have
        ``dest`` on their ``PYTHONPATH``, so modules from the notebook's
        directory import there. Sync before ``spawn_procs``, and again whenever
        the files change (running processes see the new files; a module they
        already imported needs ``importlib.reload``). ``.git``, ``__pycache__``
        and ``.ipynb_checkpoints`` are left out.

        ``transport``: ``"rsync"`` over the ssh that started the hosts
        (:func:`~monarch_nb.ssh_hosts`; sends only what changed since the last
        sync), ``"agent"`` (one archive over the agents' encrypted link, at most
        512 MiB; ``compress=True`` gzips it, for slow links), or ``"auto"``:
        rsync where the hosts came from ssh_hosts and rsync is installed here,
        the agent otherwise or where rsync fails (e.g. a host without it). On ``this_host()``
        there is nothing to copy: returns ``[]``.
        """
        return _workspace_sync.sync_workspace(
            self._agents,
            paths,
            dest=dest,
            on_path=on_path,
            compress=compress,
            transport=transport,
            timeout=timeout,
        )

    def shutdown(self) -> Future[None]:
        """Stop the agents (a multi-host mesh) and every process they run.

        Returns once they have stopped, with a future that is already done
        (Monarch's ``hosts.shutdown().get()`` and ``await`` work too). Raises
        MeshUsageError on a slice: shut down the mesh that started the hosts.
        Afterwards, as Monarch's, a second ``shutdown()`` or a ``stop()`` returns
        a future that raises HostMeshShutDown (a RuntimeError too, "HostMesh has
        already been shut down") when awaited or read, and spawning raises it.
        """
        self._check_whole("shutdown()")
        if self._agents is not None:
            if self._agents.shut_down:
                return failed(HostMeshShutDown("shutdown()"))
            self._agents.shutdown()
        return completed(None)

    def __enter__(self) -> HostMesh:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.shutdown()


def this_host(controller: Controller | None = None) -> HostMesh:
    """The host this controller runs on (``controller``: the process default).

    In a process started through ``HostMesh.with_python_executable(path)``, its
    new processes run ``path`` too, as Monarch's."""
    return HostMesh(controller, python=_interpreter.inherited())


def _this_host_of(hostname: str) -> HostMesh:
    if hostname != socket.gethostname():
        raise MeshUsageError(
            f"a reference to host {hostname!r} reached {socket.gethostname()!r}: only "
            "a process on that host can start processes there"
        )
    return this_host()


def shutdown_context() -> Future[None]:
    """Stop every process mesh and host mesh this process started, as Monarch's
    ``shutdown_context()``: blocking, then a future that is already done.

    Safe to call twice, or when nothing was started; meshes started afterwards
    work as usual. (Interpreter exit does the same, with a kill instead of a
    graceful stop.)
    """
    controller = Controller._default
    if controller is not None and not controller.loop.stopping:
        for group in list(controller.groups):
            group.stop()
        for hosts in list(controller.host_meshes):
            hosts.shutdown()
    return completed(None)


def _spawn_settled(
    group: ProcGroup,
    actor_id: int,
    record: SpawnRecord,
    future: Future[Any],
) -> None:
    """A spawn's every rank answered (on the thread that completed it): if an
    ``__init__`` failed, what the actor mesh's calls raise from now on."""
    error = future.exception(timeout=0)
    if not isinstance(error, SpawnError):
        # Done, or its ranks died or restarted first: the actors are lost there as
        # any actor on such a rank is, and a restart of the rank spawns them again.
        return
    if group.spawned.get(actor_id) is record:  # nothing to spawn again on a restart
        del group.spawned[actor_id]
    group.init_failures[actor_id] = error
    if group.owner is None:
        # No actor supervises this mesh: the controller's unhandled_fault_hook
        # hears of it, as of any unsupervised failure (Monarch's __init__ rule),
        # once per rank whose __init__ raised: each actor that failed is a
        # supervision event of its own there.
        for failed in error.failures:
            cause = SpawnError([failed], actor=error.actor, endpoint=error.endpoint)
            failure = MeshFailure(
                f"actor mesh {record.name!r} could not start: {cause}",
                ranks=cause.ranks,
                cause=cause,
                mesh=group.name,
                actor=record.name,
            )
            _context.report_child_failure(None, failure)


publish(globals())
