"""The worker processes behind a process mesh, and their life cycle.

A :class:`ProcGroup` starts ``python -m monarch_nb.worker`` once per rank,
hands each its bootstrap (signing key included) through a stdin pipe, so no
secret is ever on a command line, and watches them from the I/O thread:
a pidfd per process reports an exit the instant it happens, and the
stdout/stderr pipes are forwarded line by line.

Life cycle, a small closed set of states::

    Starting -> Running -> Failed(cause) -> (restart) Starting ...
                        \\-> Stopped

A rank that dies does not fail the group: it is marked dead (``dead``), the
calls still waiting on it fail, and calls to the other ranks go on, so a view
without it (``healthy()``) keeps working. ``restart(ranks=[...])`` replaces
only dead (or chosen) processes; a :class:`~._recovery.RestartPolicy` does it
by itself. The group as a whole fails when it cannot start, when a policy's
restarts run out, or when a rank reports an unhandled supervision failure.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._common import _context, _logs, _peer, _py_spy, _refs, _rundir
from .._common._descendants import kill_tree
from .._common._dist import STORE_ENV, fresh_store_path
from .._common._errors import MeshFailure, MeshUsageError, RemoteError, SpawnError
from .._common._future import Future
from .._common._hints import restart_hint, restart_ranks_hint
from .._common._messages import (
    BroadcastFailure,
    CommFromRank,
    CommToRank,
    DebugEnded,
    DebugInput,
    DebugOutput,
    DebugPrompt,
    DebugRefused,
    Display,
    Heartbeat,
    Hello,
    Interrupt,
    Message,
    ProtocolError,
    ResourceSample,
    Shutdown,
    Spawn,
    StatusQuery,
    StatusReply,
    Supervision,
)
from .._common._network import free_port, interface_of, visible_gpus
from .._common._shape import Shape
from .._common._spawn import kill_leftovers, start_worker
from .._common._unix_link import SCHEME as LINK_SCHEME
from .._common._wire import CONTROLLER, Encoded, Signer, decode_payload, new_key
from . import _events as ev
from ._calls import CallFuture, send_call
from ._client import Controller
from ._history import History
from ._log_stream import OutputPrinter
from ._oom import OomWitness, describe_oom
from ._recovery import RestartBudget, RestartPolicy
from ._telemetry import TelemetryHistory
from ._timeline import TimelineRecorder

if TYPE_CHECKING:
    from ._hosts import HostAgents
from ._status import MeshState, MeshStatus, RankStatus, RestartRecord, describe_exit

_log = logging.getLogger("monarch_nb")
_group_ids = itertools.count(1)
START_TIMEOUT_S = float(os.environ.get("MONARCH_NB_START_TIMEOUT", "60"))
HEARTBEAT_S = float(os.environ.get("MONARCH_NB_HEARTBEAT", "1.0"))
# A live rank that sent no heartbeat for three beats (at least 3 s) is stopped
# (or holds the GIL): named as such when a call to it times out. Read at use, as
# config.configure(heartbeat=...) changes the beat.
SILENT_BEATS = 3
STOP_GRACE_S = float(os.environ.get("MONARCH_NB_STOP_GRACE", "5"))
KILL_WAIT_S = 10.0  # after SIGKILL: at once locally; a remote exit is reported by its agent
_STDERR_TAIL_LINES = 20
_FAULT_HEADER = "Fatal Python error:"  # how faulthandler's report starts
# What a rank prints on stderr when it refuses its log directory (another
# user's, or a link: _worker._log_file.install); the controller says it once.
_NO_LOG_FILE = "monarch_nb: no log file for this rank: "
_told_no_log_file: set[str] = set()
_told_lock = threading.Lock()
_FAULT_REPORT_LINES = 200
OUTPUT_TAIL_LINES = 200  # per rank, for status views of what a rank printed last
# Modules every worker started from now on imports first and calls
# ``install_on_worker(worker)`` of: how layers above the core (the debugger)
# get onto the ranks without the core importing them.
WORKER_IMPORTS: list[str] = []
# Makes the object that serves a group's pdb prompts (it subscribes to the
# group's Debugger* events); set by monarch_nb.debug.install().
DEBUGGER_FOR: Callable[[ProcGroup], object] | None = None
NO_DEBUGGER = (
    "breakpoint() on a rank needs a debugger prompt on the controller, and none is "
    "attached: in a notebook run %load_ext monarch_nb before %mesh start; in a script "
    "call monarch_nb.debug.install() before spawn_procs()"
)


@dataclass(frozen=True)
class Starting:
    pass


@dataclass(frozen=True)
class Running:
    pass


@dataclass(frozen=True)
class Failed:
    error: MeshFailure


@dataclass(frozen=True)
class Stopped:
    pass


State = Starting | Running | Failed | Stopped


@dataclass
class SpawnRecord:
    """How an actor mesh was spawned, to spawn it again on ranks that restart."""

    name: str
    cls: type
    args: tuple
    kwargs: dict
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    ranks: tuple[int, ...]
    stopped: set[int] = field(default_factory=set)  # ranks whose actor was stopped


class WorkerProcess:
    """One worker as the controller tracks it: identity, exit, output, heartbeats.

    Touched on the I/O thread. How it is killed and waited for depends on who
    started it: :class:`LocalWorker` (this process) or a host agent's worker
    (:class:`~._hosts.RemoteWorker`).
    """

    def __init__(self, rank: int, identity: bytes, pid: int, host: str) -> None:
        self.rank = rank
        self.identity = identity
        self.pid = pid
        self.host = host
        self.returncode: int | None = None
        self.lost: str | None = None  # why its host stopped answering, if it did
        self.partial = {"stdout": b"", "stderr": b""}
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        # What faulthandler printed when the process crashed (a segfault, an abort):
        # from its "Fatal Python error" line on, every thread's Python stack.
        self.fault_report: list[str] = []
        self.output_tail: deque[ev.Output] = deque(maxlen=OUTPUT_TAIL_LINES)
        # The last two heartbeats (monotonic time, sample): CPU % is their slope.
        self.heartbeat: tuple[float, ResourceSample] | None = None
        self.previous_heartbeat: tuple[float, ResourceSample] | None = None
        self.started = time.monotonic()  # silent since then, until a first heartbeat
        self.work = ""  # as of the last heartbeat
        self.work_seconds = 0.0
        self.oom: OomWitness | None = None  # what its cgroup said at start (local workers)
        self.out_of_memory: str | None = None  # the evidence, if it was OOM-killed

    def exit_cause(self) -> str:
        """Why it is gone: its host lost, out of memory, or its exit code or signal."""
        assert self.returncode is not None
        if self.lost:
            return self.lost
        if self.out_of_memory:
            return describe_oom(self.out_of_memory)
        return describe_exit(self.returncode)

    @property
    def route(self) -> bytes | None:
        """The agent that relays to this worker, or None if it talks to us directly."""
        return None

    def kill(self) -> None:
        """SIGKILL it (any thread); its exit is reported as usual."""
        raise NotImplementedError

    def wait(self, timeout: float | None) -> bool:
        """Wait until it exited; False if still running after ``timeout`` s."""
        raise NotImplementedError

    def py_spy(self, **options: Any) -> _py_spy.Outcome:
        """Run py-spy on it, on its host (see ``_py_spy.execute``; any thread, blocking)."""
        raise NotImplementedError


class LocalWorker(WorkerProcess):
    """A worker this process started: a child with a pidfd and two pipes."""

    def __init__(self, rank: int, identity: bytes, popen: subprocess.Popen[bytes]) -> None:
        super().__init__(rank, identity, popen.pid, socket.gethostname())
        self.popen = popen
        self.pidfd = os.pidfd_open(popen.pid)
        self.oom = OomWitness(popen.pid)
        self._leftovers_killed = False

    def kill(self) -> None:
        if self.popen.poll() is None:
            kill_tree(self.popen.pid)  # what it started too, in any session

    def wait(self, timeout: float | None) -> bool:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        # Reaped here (a stop), the I/O thread's exit handler may never run: the
        # stop forgets the pidfd, and on a busy host it may do so first.
        self.kill_leftovers()
        return True

    def kill_leftovers(self) -> None:
        """What is left of its process group, killed once, by whoever reaped it
        first: later, its pid may lead another process's group (see
        ``_spawn.kill_leftovers``)."""
        if not self._leftovers_killed:
            self._leftovers_killed = True
            kill_leftovers(self.pid)

    def py_spy(self, **options: Any) -> _py_spy.Outcome:
        return _py_spy.execute(self.pid, **options)


class ProcGroup:
    """The processes of one ``spawn_procs`` (all its views share this object)."""

    def __init__(
        self,
        sizes: Mapping[str, int],
        *,
        controller: Controller,
        env: Mapping[str, str] | None = None,
        gpus: bool = False,
        name: str = "procs",
        agents: HostAgents | None = None,
        restart: RestartPolicy | None = None,
    ) -> None:
        self.id = next(_group_ids)
        # Names this group's inboxes in the tree's run directory, which nested
        # meshes (started by actors) share: unique across processes, not a counter.
        self.uid = secrets.token_hex(6)
        # Where the workers run: None, children of this process; else the hosts
        # of a multi-host mesh (the shape's first dimension), through their agents.
        self.agents = agents
        self.name = name
        self.shape = Shape.from_sizes(sizes)
        # Where this mesh's run begins in its ranks' log files, which meshes of the
        # same name share (to the millisecond, as the files write time): logs() reads
        # from here unless asked for every run.
        self.run_started = _logs.now_to_the_millisecond()
        self.extra_env = dict(env or {})
        self.gpus = gpus
        self.controller = controller
        self.controller.groups.add(self)
        self.events = ev.EventStream(name, controller.loop)
        self.rank_failures: dict[int, str] = {}  # rank -> its last failure, until its next call
        self.hosts: dict[int, str] = {}  # rank -> the host its hello came from
        self.peer_addresses: dict[int, str] = {}  # rank -> its TCP inbox (other hosts)
        self._queries: dict[int, tuple[Future[Any], dict[int, StatusReply], int]] = {}
        self._query_ids = itertools.count(1)
        self.generation = 0
        self.heartbeat_s = HEARTBEAT_S  # the ranks' beat, set again at each start
        self.state: State = Starting()
        self.workers: list[WorkerProcess] = []
        self._key = b""  # a fresh key and signer for every start()
        self.signer: Signer
        self.owner = _context.current_actor_or_none()  # who supervises us, if an actor
        self.actor_failures: dict[int, MeshFailure] = {}
        self.init_failures: dict[int, SpawnError] = {}  # actor id -> its __init__'s error
        self.ready_ranks: set[int] = set()  # ranks of this generation that said hello
        self._all_ready = threading.Event()
        self.debugger: object | None = None  # see DEBUGGER_FOR
        self.paused: set[int] = set()  # ranks stopped in pdb, waiting for a line
        self.idle_since: dict[int, float] = {}  # rank -> when its last call in flight ended
        # Partial failure and restarts (see the module docstring).
        self.dead: dict[int, MeshFailure] = {}  # rank -> why it takes no calls
        self.restart_policy = restart
        self._budget = RestartBudget(restart) if restart is not None else None
        self.spawned: dict[int, SpawnRecord] = {}  # actor id -> how to spawn it again
        # actor id -> the generation a replay spawned it again in: its old handles work
        self.replayed_actors: dict[int, int] = {}
        self.history = History()  # what built the ranks' state, for restart(replay=True)
        self.timeline = TimelineRecorder()  # who ran which call when: procs.timeline()
        self.telemetry = TelemetryHistory()  # resources and metrics over time
        self.missing_actors: dict[int, dict[int, str]] = {}  # actor id -> rank -> why absent
        self.restarts: deque[RestartRecord] = deque(maxlen=20)
        # Run after ranks got fresh processes (restart(ranks=...) or a policy), with
        # those ranks: how the notebook sets torch.distributed up again.
        self.after_restart: list[Callable[[tuple[int, ...]], None]] = []
        self._env: dict[str, str] = {}
        self._incarnation: dict[int, int] = {}
        self._restarting: set[int] = set()
        self._replacing_all = False  # restart(): between the kill and the new start
        self._restart_failed: dict[int, str] = {}  # rank -> why its new process did not start
        self._ready_changed = threading.Condition()
        self._restart_lock = threading.Lock()
        self._pending_restart: dict[int, str] = {}  # rank -> cause, for the policy's thread
        self._restarter: threading.Thread | None = None
        self.printer: OutputPrinter | None = None  # prints a script mesh's output
        # logging_option(): (stream_to_client, aggregate_window_sec), for every printer.
        self.output_option: tuple[bool, float | None] = (True, None)
        # Resizing (see ._resize): the inboxes processes adopted from an earlier
        # group bound under their old ranks (new rank -> address), and, in the
        # group they left, what it was resized into.
        self.inboxes: dict[int, str] = {}
        self.resized_into: str | None = None
        self.successor: ProcGroup | None = None  # stopping this group stops that one

    # -- starting -------------------------------------------------------------

    def start(self) -> None:
        """Start every worker and wait until each said hello (blocking)."""
        key = new_key()
        # Through agents, every hop is trusted (CURVE, then the agent's private
        # Unix socket); children of ours are, unless MONARCH_NB_BIND made their
        # link a plain TCP port (see _wire's docstring).
        trusted = self.agents is not None or self.controller.address.startswith(
            ("ipc://", LINK_SCHEME)
        )
        signer = Signer(
            key, self.controller.stats, sender=CONTROLLER, upstream=False, trusted_link=trusted
        )
        # Under the lock senders hold: a send sees the old generation whole (its
        # state, workers and signer) or the new one refusing calls while it
        # starts, never the new empty worker list behind the old state.
        with self.controller.send_lock:
            self.generation += 1
            self.state = Starting()
            self.actor_failures.clear()
            self.init_failures.clear()
            self.rank_failures.clear()
            self.paused.clear()
            self.idle_since.clear()
            self.dead.clear()
            self.spawned.clear()
            self.missing_actors.clear()
            self._restarting.clear()
            self.inboxes = {}
            self.hosts = {}
            self.peer_addresses = {}
            self.workers = []  # the new generation's, once launched
            self._key, self.signer = key, signer
        self._all_ready.clear()
        self.ready_ranks = set()
        ranks = range(len(self.shape))
        # Random routing ids (128 bits each): another local user who could guess
        # them could connect first under a worker's name and make its real hello
        # unroutable (a restart that "did not start"). They travel on the bootstrap pipe.
        identities = [f"w{secrets.token_hex(16)}.{rank}".encode() for rank in ranks]
        # Known before any worker exists: a fast worker's hello must not find
        # its identity unknown (and be dropped) while we still start the others.
        self.controller.run(lambda: self._register_peers(identities))
        if self.agents is not None:
            agents = self.agents
            self.controller.run(lambda: agents.launch(self, identities, self._bootstrap(key)))
        else:
            base_env = self._env = self._base_env()
            # Launched from the I/O thread, which lives as long as the controller: a
            # worker's parent-death signal fires when the *thread* that forked it
            # ends, and a caller's thread may end long before the mesh does. Listed
            # in the same turn of that thread, which also handles the workers'
            # hellos: the last hello (the mesh is Running from then) always finds
            # them listed. Two turns let a call racing a restart find a running mesh
            # with no workers (an IndexError in the caller's send).
            self.controller.run(
                lambda: self._watch(self._launch_all(ranks, identities, key, base_env))
            )
        if self.events.observed:
            for rank in ranks:
                self.events.emit(ev.RankStateChanged(self.name, rank, ev.RankState.STARTING))
        if not self._all_ready.wait(START_TIMEOUT_S):
            self.kill()
            raise MeshFailure(
                f"{self.name}: workers did not start within {START_TIMEOUT_S} s "
                "(set MONARCH_NB_START_TIMEOUT to wait longer)",
                ranks=self.shape.ranks,
            )
        if isinstance(self.state, Failed):
            error = self.state.error
            self.kill()  # the ranks that did start must not outlive a failed start
            raise error

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The tree's private socket directory: a worker that starts meshes of its
        # own puts their inboxes there too (and never makes, or leaks, one).
        env[_rundir.ENV_VAR] = _rundir.run_dir()
        env[_rundir.TREE_ROOT_ENV] = str(_rundir.tree_root())
        # torch's CPU allocator on transparent huge pages: one-sided reads of a
        # rank's tensors (RDMABuffer) walk 2 MiB pages, not 4 KiB ones, and run
        # about twice as fast here. The user's own setting wins.
        env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
        if self.agents is None:  # one host: torch.distributed meets in a private file
            env[STORE_ENV] = fresh_store_path()
        # ... and a user's own init_process_group (env://) on loopback: its store
        # (the worker keeps it there, see _dist) and gloo's and NCCL's sockets,
        # unless the user chose an interface.
        host = "127.0.0.1"  # every rank is on this host
        loopback = interface_of(host)
        if loopback is not None:
            env.setdefault("GLOO_SOCKET_IFNAME", loopback)
            env.setdefault("NCCL_SOCKET_IFNAME", loopback)
        env.update(
            WORLD_SIZE=str(len(self.shape)),
            LOCAL_WORLD_SIZE=str(len(self.shape)),
            MASTER_ADDR=host,
            MASTER_PORT=str(free_port(host)),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def _bootstrap(self, key: bytes) -> dict[str, Any]:
        """What every worker of this generation reads on stdin (per rank: add
        ``identity`` and ``rank``; the launcher adds ``address`` and ``controller_pid``)."""
        boot = {
            "key": key.hex(),
            "shape": [list(self.shape.labels), list(self.shape.sizes)],
            "mesh": self.name,
            "heartbeat_s": HEARTBEAT_S,
            "imports": list(WORKER_IMPORTS),
        }
        self.heartbeat_s = HEARTBEAT_S  # this generation's beat, for silent_ranks()
        # Actor-to-actor messages: each rank binds an inbox (prefix + rank on this
        # host; a TCP port it reports in its hello on other hosts).
        boot["peer"] = {
            "ref": dataclasses.asdict(self._local_ref()),
            "key": _peer.tree_key().hex(),
            "curve": _peer.tree_curve(),
            "tcp": self.agents is not None,
        }
        if self.agents is not None:  # ports opened here must be reachable from there
            _peer.local_node().listen_tcp(self.agents.bind_host())
        return boot

    def _local_ref(self) -> _refs.ProcsRef:
        prefix = _rundir.socket_path(f"{self.uid}-{self.generation}-")
        inboxes: tuple[str, ...] = ()
        if self.inboxes:
            inboxes = tuple(self.inboxes.get(r, f"{prefix}{r}") for r in self.shape.ranks)
        return _refs.ProcsRef(
            self.uid,
            self.generation,
            self.name,
            socket.gethostname(),
            prefix,
            _refs.ViewRef.of(self.shape),
            inboxes=inboxes,
        )

    def ref(self) -> _refs.ProcsRef | None:
        """What a reference to this generation's processes carries; None while a
        rank on another host has not said where it listens."""
        ref = self._local_ref()
        if self.agents is None:
            return ref
        addresses = dict(self.peer_addresses)
        if len(addresses) < len(self.shape):
            return None
        return dataclasses.replace(ref, table=_refs.compact_table(addresses))

    def _launch_all(
        self, ranks: range, identities: list[bytes], key: bytes, base_env: dict[str, str]
    ) -> list[LocalWorker]:
        """Start every rank, or none: a launch that fails part way (a process limit,
        no memory) kills the ranks it already started before it raises."""
        launched: list[LocalWorker] = []
        try:
            for rank in ranks:
                launched.append(self._launch(rank, identities[rank], key, base_env))
        except Exception as exc:
            for worker in launched:
                worker.popen.kill()
            for worker in launched:
                worker.wait(None)
            self.state = Failed(
                MeshFailure(f"{self.name}: could not start rank {len(launched)}: {exc}")
            )
            raise MeshFailure(
                f"{self.name}: could not start rank {len(launched)} of {len(ranks)} "
                f"({type(exc).__name__}: {exc}); the {len(launched)} already started were "
                "stopped. Start fewer processes, or raise the limit that refused this one",
                ranks=list(ranks),
            ) from exc
        return launched

    def _launch(
        self, rank: int, identity: bytes, key: bytes, base_env: dict[str, str]
    ) -> LocalWorker:
        env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus()[rank]
        bootstrap = dict(
            self._bootstrap(key),
            address=self.controller.address,
            identity=identity.decode(),
            rank=rank,
            controller_pid=os.getpid(),
        )
        popen = start_worker(env, bootstrap)
        return LocalWorker(rank, identity, popen)

    def _register_peers(self, identities: list[bytes]) -> None:
        agents = self.agents
        for rank, identity in enumerate(identities):
            via = agents.route_of_rank(self, rank) if agents is not None else None
            self.controller.add_peer(identity, self, rank, via)

    def _watch(self, workers: list[LocalWorker]) -> None:
        self.workers = list(workers)
        for w in workers:
            self._watch_one(w)

    def _watch_one(self, w: LocalWorker) -> None:
        loop = self.controller.loop
        loop.add_fd(w.pidfd, functools.partial(self._on_exit, w))
        for name, pipe in (("stdout", w.popen.stdout), ("stderr", w.popen.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            loop.add_fd(pipe.fileno(), functools.partial(self._on_output, w, name, pipe))

    # -- I/O thread -----------------------------------------------------------------

    def identity(self, rank: int) -> bytes:
        return self.workers[rank].identity

    def routes(self, ranks: tuple[int, ...]) -> list[tuple[bytes | None, list[bytes]]]:
        """``ranks``' identities grouped by the agent that relays to them (None:
        direct), so a cast is one message per host (under the controller's lock)."""
        workers = self.workers
        if self.agents is None:
            return [(None, [workers[r].identity for r in ranks])]
        by_route: dict[bytes | None, list[bytes]] = {}
        for r in ranks:
            worker = workers[r]
            by_route.setdefault(worker.route, []).append(worker.identity)
        return list(by_route.items())

    def failure_for(self, ranks: tuple[int, ...]) -> MeshFailure | None:
        """Why ``ranks`` cannot take a call now, or None. Decisive only under the
        controller's lock (as ``Controller.send`` reads it); elsewhere a hint."""
        match self.state:
            case Failed(error):
                return error
            case Stopped() if self.resized_into is not None:
                return MeshFailure(
                    f"process mesh {self.name!r} was resized into {self.resized_into}: use the "
                    "mesh that resize() or grow() returned (actor meshes: spawn them again on it)",
                    ranks=ranks,
                )
            case Stopped():
                return MeshFailure(
                    f"process mesh {self.name!r} was stopped; start a new one or call restart()",
                    ranks=ranks,
                )
            case Starting():
                return MeshFailure(
                    f"process mesh {self.name!r} is starting (or restarting); call again once "
                    "spawn_procs() or restart() has returned",
                    ranks=ranks,
                )
        if self.dead or self._restarting:
            return self._rank_failure(ranks)
        return None

    def _rank_failure(self, ranks: tuple[int, ...]) -> MeshFailure | None:
        """Why some of ``ranks`` take no calls (dead or restarting), or None."""
        restarting = [r for r in ranks if r in self._restarting]
        if restarting:
            return MeshFailure(
                f"rank(s) {_describe_ranks(tuple(restarting))} of process mesh {self.name!r} "
                "are being restarted; call again once the restart is done (restart() "
                "returned, or a RanksRestarted event came)",
                ranks=tuple(restarting),
            )
        errors = {r: self.dead[r] for r in ranks if r in self.dead}
        if not errors:
            return None
        distinct = list({id(e): e for e in errors.values()}.values())
        if len(distinct) == 1:
            return distinct[0]
        return MeshFailure(
            f"ranks {_describe_ranks(tuple(errors))} of process mesh {self.name!r} are dead: "
            + "; ".join(str(e) for e in distinct),
            ranks=tuple(errors),
            cause=distinct[0],
        )

    def actor_missing(self, actor_id: int, name: str, ranks: tuple[int, ...]) -> MeshFailure | None:
        """Why actor ``actor_id`` is absent from some of ``ranks`` (they restarted), or None."""
        missing = self.missing_actors.get(actor_id)
        absent = {r: missing[r] for r in ranks if r in missing} if missing else {}
        if not absent:
            return None
        _, why = next(iter(absent.items()))
        return MeshFailure(
            f"actor mesh {name!r} has no actor on rank(s) {_describe_ranks(tuple(absent))}: {why}",
            ranks=tuple(absent),
        )

    def live_ranks(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """``ranks`` that can take calls now: neither dead nor restarting."""
        return tuple(r for r in ranks if r not in self.dead and r not in self._restarting)

    def encode(self, message: Message, payload: Any = None) -> Encoded:
        """Sign ``message`` with this generation's key (once, for any number of ranks)."""
        return self.signer.encode(message, payload)

    def note_failure(self, rank: int, cause: str) -> None:
        """``rank`` raised: it shows FAILED once it has no other call in flight. An
        interrupt (Ctrl-C, a timeout, fail-fast) is a stop someone asked for, not a
        failure of the rank."""
        if not cause.startswith("KeyboardInterrupt"):
            self.rank_failures[rank] = cause

    def rank_settled(self, rank: int) -> None:
        """``rank`` has no call in flight any more: say what it is now (any thread)."""
        events = self.events
        if not events.observed or not events.wants(ev.RankStateChanged):
            return
        state = self.rank_state(rank)
        if state in (ev.RankState.IDLE, ev.RankState.FAILED):  # DEAD, STOPPED: said on exit
            detail = self.rank_failures.get(rank, "") if state is ev.RankState.FAILED else ""
            events.emit_soon(ev.RankStateChanged(self.name, rank, state, detail))

    def rank_state(self, rank: int) -> ev.RankState:
        """What ``rank`` is doing now: the one rule behind events and ``status()``."""
        worker = self.workers[rank] if rank < len(self.workers) else None
        stopped = isinstance(self.state, Stopped)
        if worker is None:
            return ev.RankState.STOPPED if stopped else ev.RankState.STARTING
        if worker.returncode is not None:
            return ev.RankState.STOPPED if stopped else ev.RankState.DEAD
        if stopped:
            return ev.RankState.STOPPED
        if rank not in self.ready_ranks:
            return ev.RankState.STARTING
        if rank in self.paused:
            return ev.RankState.PAUSED
        if self.controller.outstanding.get((self.id, rank), 0) > 0 or self._heartbeat_busy(
            worker, rank
        ):
            return ev.RankState.BUSY
        if rank in self.rank_failures:
            return ev.RankState.FAILED
        return ev.RankState.IDLE

    def _heartbeat_busy(self, worker: WorkerProcess, rank: int) -> bool:
        """The rank said it runs something (a broadcast, a cancelled call) after it
        last went idle as far as calls are concerned."""
        beat = worker.heartbeat
        return bool(worker.work) and beat is not None and beat[0] > self.idle_since.get(rank, 0.0)

    def on_worker_message(self, rank: int, message: Message, frames: list[Any]) -> None:
        """A worker's message other than a call's reply (I/O thread)."""
        match message:
            case Hello(_, host, peer):
                # may come before _watch() lists the workers; an agent's host name wins
                self.hosts.setdefault(rank, host)
                if peer:
                    self.peer_addresses[rank] = peer
                self.ready_ranks.add(rank)
                if self.events.observed:
                    self.events.emit(ev.RankStateChanged(self.name, rank, ev.RankState.IDLE))
                if len(self.ready_ranks) == len(self.shape) and isinstance(self.state, Starting):
                    self.state = Running()
                    self._all_ready.set()
                if rank in self._restarting:
                    self._notify_restart()
            case Heartbeat(sample, work, work_seconds, metrics):
                if rank >= len(self.workers):
                    return  # still starting: the next one will do
                worker = self.workers[rank]
                before = worker.heartbeat[1] if worker.heartbeat else None
                self.telemetry.add_heartbeat(rank, sample, before, metrics)
                worker.previous_heartbeat = worker.heartbeat
                worker.heartbeat = (time.monotonic(), sample)
                worker.work, worker.work_seconds = work, work_seconds
                if self.events.observed:
                    self.events.emit(ev.Heartbeat(self.name, rank, sample, work, work_seconds))
            case BroadcastFailure(actor_id, label, failure):
                actor, _, endpoint = label.partition(".")
                error = RemoteError([failure], actor=actor, endpoint=endpoint)
                record = self.spawned.get(actor_id)
                self.actor_failures[actor_id] = MeshFailure(
                    f"broadcast of {label} failed on rank {rank}, so this actor mesh is failed; "
                    f"spawn it again: {error}",
                    ranks=(rank,),
                    cause=error,
                    mesh=self.name,
                    actor=record.name if record is not None else actor,
                )
                _log.error("monarch_nb: %s", self.actor_failures[actor_id])
                self.note_failure(rank, f"{failure.type_name}: {failure.message}")
                # Up the supervision tree, as a mesh failure: the owner's
                # __supervise__, or the unhandled_fault_hook.
                _context.report_child_failure(self.owner, self.actor_failures[actor_id])
                if self.events.observed:
                    self.events.emit(
                        ev.RankFailed(
                            self.name,
                            rank,
                            f"{failure.type_name}: {failure.message}",
                            traceback=failure.traceback,
                            label=label,
                        )
                    )
            case Display():
                try:
                    payload = decode_payload(frames)
                except Exception as exc:
                    payload = {"data": {"text/plain": f"<display failed: {exc!r}>"}}
                if self.events.observed and isinstance(payload, dict):
                    data, metadata = payload.get("data"), payload.get("metadata") or {}
                    if isinstance(data, dict) and isinstance(metadata, dict):
                        self.events.emit(ev.DisplayData(self.name, rank, data, metadata))
            case CommFromRank(msg_type, comm_id, target_name):
                self._on_comm(rank, msg_type, comm_id, target_name, frames)
            case StatusReply():
                self._on_status_reply(rank, message)
            case Supervision(text):
                self.fail(
                    MeshFailure(
                        f"rank {rank} of {self.name!r} reported an unhandled failure: {text}",
                        ranks=(rank,),
                        cause=text,
                    )
                )
            case DebugPrompt() | DebugOutput() | DebugEnded():
                self._on_debug(rank, message)
            case ProtocolError(detail):
                _log.error("monarch_nb: rank %d of %r: %s", rank, self.name, detail)
            case _:
                _log.error(
                    "monarch_nb: rank %d of %r sent %s, which a controller does not handle",
                    rank,
                    self.name,
                    type(message).__name__,
                )

    def _on_debug(self, rank: int, message: DebugPrompt | DebugOutput | DebugEnded) -> None:
        # The prompt side (monarch_nb.debug) observes these events. Without one the
        # rank would wait for input forever, so it is told to raise instead.
        if self.debugger is None:
            if DEBUGGER_FOR is None:
                if isinstance(message, DebugPrompt):
                    self.send_debug(rank, DebugRefused(NO_DEBUGGER))
                return
            self.debugger = DEBUGGER_FOR(self)
        match message:
            case DebugPrompt(prompt, location):
                self.paused.add(rank)
                self.events.emit(
                    ev.RankStateChanged(self.name, rank, ev.RankState.PAUSED, location)
                )
                self.events.emit(ev.DebuggerPaused(self.name, rank, prompt, location))
            case DebugOutput(text):
                self.events.emit(ev.DebuggerOutput(self.name, rank, text))
            case DebugEnded(how):
                self.paused.discard(rank)
                self.events.emit(ev.DebuggerResumed(self.name, rank, how))
                self.events.emit(ev.RankStateChanged(self.name, rank, ev.RankState.BUSY, how))

    def _on_comm(
        self, rank: int, msg_type: str, comm_id: str, target_name: str, frames: list[Any]
    ) -> None:
        if not (self.events.observed and self.events.wants(ev.CommMessage)):
            return  # nobody relays comms (a script): the rank's widget talks to nobody
        try:
            payload = decode_payload(frames)
            data, metadata = dict(payload["data"]), dict(payload["metadata"])
            buffers = tuple(bytes(b) for b in payload["buffers"])
        except Exception as exc:
            _log.error("monarch_nb: rank %d of %r sent a comm message: %r", rank, self.name, exc)
            return
        self.events.emit(
            ev.CommMessage(self.name, rank, msg_type, comm_id, target_name, data, metadata, buffers)
        )

    def send_comm(self, rank: int, message: CommToRank) -> None:
        """Hand the notebook's message to a comm that ``rank`` opened (any thread)."""
        if self.workers[rank].returncode is None:
            self.controller.send(self, (rank,), self.encode(message))

    def send_debug(self, rank: int, message: DebugInput | DebugRefused) -> None:
        """Answer ``rank``'s pdb prompt (any thread); sent even to a failed mesh, whose
        other ranks may still be paused."""
        if self.workers[rank].returncode is None:
            self.controller.send(self, (rank,), self.encode(message), even_if_failed=True)

    def _on_output(self, worker: WorkerProcess, stream: str, pipe: Any) -> None:
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.controller.loop.remove_fd(pipe.fileno())
            self.output_ended(worker, stream)
            return
        self.on_output(worker, stream, chunk)

    def output_ended(self, worker: WorkerProcess, stream: str) -> None:
        """``stream`` of ``worker`` reached its end: emit a last unterminated line."""
        if worker.partial[stream]:
            self._emit(worker, stream, worker.partial[stream])
            worker.partial[stream] = b""

    def on_output(self, worker: WorkerProcess, stream: str, chunk: bytes) -> None:
        """Bytes ``worker`` wrote to ``stream``, split into lines (I/O thread)."""
        data = worker.partial[stream] + chunk
        *lines, partial = data.split(b"\n")
        for line in lines:
            self._emit(worker, stream, line.rsplit(b"\r", 1)[-1] if b"\r" in line[:-1] else line)
        # Progress bars rewrite one line with "\r": pass each update on live.
        *updates, worker.partial[stream] = partial.split(b"\r")
        for update in updates:
            if update:
                self._emit(worker, stream, update, end="\r")

    def _emit(self, worker: WorkerProcess, stream: str, raw: bytes, end: str = "\n") -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        output = ev.Output(self.name, worker.rank, stream, line, end)
        if end == "\n":
            worker.output_tail.append(output)
            if stream == "stderr":
                worker.stderr_tail.append(line)
                if line.startswith(_NO_LOG_FILE):
                    _tell_no_log_file(self.name, worker.rank, line[len(_NO_LOG_FILE) :])
                if line.startswith(_FAULT_HEADER):
                    worker.fault_report = [line]
                elif worker.fault_report and len(worker.fault_report) < _FAULT_REPORT_LINES:
                    worker.fault_report.append(line)
        self.events.emit(output)

    def _drain(self, worker: LocalWorker) -> None:
        for name, pipe in (("stdout", worker.popen.stdout), ("stderr", worker.popen.stderr)):
            if pipe is not None and not pipe.closed:
                for _ in range(64):  # bounded: a grandchild could hold the pipe open
                    before = worker.partial[name]
                    self._on_output(worker, name, pipe)
                    if worker.partial[name] == before:
                        break

    def _on_exit(self, worker: LocalWorker) -> None:
        self.controller.loop.remove_fd(worker.pidfd)
        os.close(worker.pidfd)
        worker.pidfd = -1
        worker.returncode = worker.popen.wait()
        worker.kill_leftovers()
        self._drain(worker)
        self.worker_exited(worker)

    def worker_exited(self, worker: WorkerProcess) -> None:
        """``worker`` is gone, its ``returncode`` set and its output read (I/O thread)."""
        assert worker.returncode is not None
        if worker.identity not in self._identities():
            return  # a process of an earlier generation
        rank = worker.rank
        ended = isinstance(self.state, Stopped | Failed)
        if worker.returncode == -signal.SIGKILL and worker.oom is not None and not ended:
            worker.out_of_memory = worker.oom.evidence()  # not for the kills of a stop
        if rank in self._restarting:
            if rank in self.ready_ranks:
                return  # the old process, killed to be replaced
            self._restart_failed[rank] = f"its new process {worker.exit_cause()}" + (
                "; last lines of its stderr:\n  " + "\n  ".join(worker.stderr_tail)
                if worker.stderr_tail
                else ""
            )
            self._notify_restart()
            return
        if ended or rank not in self.ready_ranks:
            if self.events.observed:
                self._emit_exit(worker)
            if ended:
                return
        running = self.controller.calls_waiting_on(self, rank)
        what = f" while running {', '.join(running)}" if running else ""
        died = (
            f"rank {rank} (pid {worker.pid}) of process mesh {self.name!r} "
            f"{worker.exit_cause()}{what}"
        )
        if worker.fault_report and rank in self.ready_ranks:  # a crash, not a failed start
            died += "; its Python stacks when it crashed (faulthandler):\n  "
            died += "\n  ".join(worker.fault_report)
        if rank not in self.ready_ranks:
            consequence = "so the mesh failed to start"
            if worker.stderr_tail:
                consequence += "; last lines of its stderr:\n  " + "\n  ".join(worker.stderr_tail)
            self.fail(MeshFailure(f"{died}; {consequence}", ranks=(rank,), cause=worker.returncode))
            return
        # Its RankFailed goes out once the rank is marked dead, so a listener
        # that reacts with healthy() already gets the survivors.
        self.ranks_lost((rank,), died, worker.returncode, announce=lambda: self._emit_exit(worker))

    def host_lost(self, workers: list[WorkerProcess], host: str, why: str) -> None:
        """Every rank on ``host`` is gone at once (its agent stopped answering, or its
        launcher ended): one failure naming exactly those ranks (I/O thread)."""
        current = self._identities()
        workers = [w for w in workers if w.identity in current and w.returncode is None]
        if not workers:
            return
        for worker in workers:
            worker.returncode, worker.lost = -signal.SIGKILL, why

        def announce() -> None:
            for worker in workers:
                self._emit_exit(worker)

        if isinstance(self.state, Stopped | Failed):
            announce()
            return
        ranks = tuple(sorted(w.rank for w in workers))
        self.ranks_lost(
            ranks,
            f"host {host} of process mesh {self.name!r} {why}: its ranks "
            f"{_describe_ranks(ranks)} are lost",
            why,
            announce=announce,
        )

    def _end_ranks(
        self, ranks: tuple[int, ...], error: MeshFailure, mark: Callable[[], None]
    ) -> int:
        """Fail the calls waiting on ``ranks`` (see ``Controller.end_ranks``); how many."""
        failed = self.controller.end_ranks(self, ranks, error, mark)
        # The other ranks' share of those calls has nobody waiting for it any more:
        # stop it (KeyboardInterrupt in that call only), so they are free at once;
        # not where the user is debugging (a rank paused in pdb), who goes on.
        for call in failed:
            others = [r for r in call.unanswered_ranks() if r not in ranks and r not in self.paused]
            if others:
                self.interrupt(others, call.call_id)
        return len(failed)

    def ranks_lost(
        self,
        ranks: tuple[int, ...],
        what: str,
        cause: object,
        announce: Callable[[], None] = lambda: None,
    ) -> None:
        """``ranks`` died (``what`` says how): fail the calls waiting on them; the
        other ranks go on. A restart policy brings them back while it may; past
        that, the mesh fails (I/O thread). ``announce`` emits their deaths: called
        once they count as dead, before any MeshFailed."""
        budget = self._budget
        if budget is not None and not budget.take():
            if self.events.observed:
                announce()
            self.fail(
                MeshFailure(
                    f"{what}; {budget.describe()}, so the mesh is failed: call restart() "
                    "to start fresh processes",
                    ranks=ranks,
                    cause=cause,
                )
            )
            return
        if budget is not None:
            policy = budget.policy
            which = "every rank" if policy.ranks == "all" else _plural_ranks(ranks)
            consequence = (
                f"its RestartPolicy restarts {which} (restart {budget.used()} of "
                f"{policy.max_restarts} within {policy.window_s:g} s)"
            )
        else:
            consequence = (
                f"calls that include it fail until it is replaced: "
                f"{restart_ranks_hint(self.name, ranks)} (the other ranks keep their state), "
                f"or {restart_hint(self.name)} for every rank; healthy() is the view of the "
                "ranks still running"
            )
        error = MeshFailure(f"{what}; {consequence}", ranks=ranks, cause=cause, mesh=self.name)

        def mark() -> None:
            for rank in ranks:
                self.dead[rank] = error

        if not self._end_ranks(ranks, error, mark):
            _log.warning("monarch_nb: %s", error)  # nobody was waiting: say it here
        if self.events.observed:
            announce()
        if budget is None:
            _context.report_child_failure(self.owner, error)
            return
        self._schedule_restart(ranks, what)

    def _emit_exit(self, worker: WorkerProcess) -> None:
        assert worker.returncode is not None
        stopping = isinstance(self.state, Stopped)
        state = ev.RankState.STOPPED if stopping else ev.RankState.DEAD
        cause = worker.exit_cause()
        if not stopping:
            self.events.emit(
                ev.RankFailed(
                    self.name,
                    worker.rank,
                    cause,
                    traceback="\n".join(worker.fault_report),
                    returncode=worker.returncode,
                )
            )
        self.events.emit(ev.RankStateChanged(self.name, worker.rank, state, cause))

    def _identities(self) -> set[bytes]:
        return {w.identity for w in self.workers}

    def fail(self, error: MeshFailure) -> None:
        """Mark the group failed and fail every call in flight to it (I/O thread)."""
        if error.mesh is None:
            error.mesh = self.name
        failed_calls = self.controller.end_group(self, Failed(error), error, unless_ended=True)
        if failed_calls is None:
            return  # already failed, or stopped on purpose
        self._all_ready.set()
        if not failed_calls:
            _log.warning("monarch_nb: %s", error)  # nobody was waiting: say it here
        self.events.emit(ev.MeshFailed(self.name, error))
        _context.report_child_failure(self.owner, error)

    # -- stopping ---------------------------------------------------------------------

    def stop(self, grace: float | None = None) -> None:
        """Ask every worker to exit, kill what is left after ``grace`` s (blocking;
        default: the ``stop_grace`` setting, read now).

        Ranks still running user code are interrupted first: whoever waited for
        that work is told the mesh stopped, so finishing it would only delay
        the exit (a rank stuck in C is killed after ``grace``). A group that was
        resized stops the group it was resized into (``with`` blocks end it)."""
        if self.successor is not None:
            self.successor.stop(grace)
            return
        if isinstance(self.state, Stopped):
            return
        busy = tuple(
            w.rank
            for w in self.workers
            if w.returncode is None and self.rank_state(w.rank) is ev.RankState.BUSY
        )
        # Stopped first: a worker that exits on the shutdown must not look like a crash.
        self.controller.end_group(
            self,
            Stopped(),
            MeshFailure(f"process mesh {self.name!r} was stopped", ranks=self.shape.ranks),
        )
        self._notify_restart()
        if busy:
            self.controller.send(self, busy, self.signer.encode(Interrupt(0)), even_if_failed=True)
        # A rank restarted meanwhile: stop its new process too.
        self.shut_down(list(self.workers), grace)

    def shut_down(self, workers: list[WorkerProcess], grace: float | None = None) -> None:
        """Ask ``workers`` to exit, kill those left after ``grace`` s (default:
        ``stop_grace``), and forget them (blocking; the group is stopped already, so
        no exit reads as a crash)."""
        if grace is None:
            grace = STOP_GRACE_S
        live = tuple(w.rank for w in workers if w.returncode is None)
        if live:
            message = self.signer.encode(Shutdown())
            self.controller.send(self, live, message, even_if_failed=True)
        deadline = time.monotonic() + grace
        for w in workers:
            if not w.wait(max(0.0, deadline - time.monotonic())):
                w.kill()
                w.wait(KILL_WAIT_S)
        self._forget(workers)

    def kill(self) -> None:
        """Kill every worker at once (no grace), e.g. before a restart."""
        if self.resized_into is not None:
            return  # its processes live on in the group it was resized into
        if not isinstance(self.state, Stopped):
            self.controller.end_group(
                self,
                Stopped(),
                MeshFailure(f"process mesh {self.name!r} was killed", ranks=self.shape.ranks),
            )
        self._notify_restart()
        for w in self.workers:
            w.kill()
        for w in self.workers:
            w.wait(KILL_WAIT_S)
        self._forget(self.workers)

    def _forget(self, workers: list[WorkerProcess]) -> None:
        def forget() -> None:
            for w in workers:
                self.controller.remove_peer(w.identity)
                if not isinstance(w, LocalWorker):
                    continue
                if w.pidfd >= 0:
                    self.controller.loop.remove_fd(w.pidfd)
                    os.close(w.pidfd)
                    w.pidfd = -1
                for pipe in (w.popen.stdout, w.popen.stderr):
                    if pipe is not None and not pipe.closed:
                        self._drain(w)
                        self.controller.loop.remove_fd(pipe.fileno())
                        pipe.close()

        self.controller.run(forget)

    def restart(self, ranks: Iterable[int] | None = None) -> RestartRecord:
        """Replace every process with a fresh one (actors must be spawned again), or
        only those of ``ranks`` (see :meth:`restart_ranks`). Blocking."""
        if ranks is not None:
            chosen = sorted(set(ranks))
            return self.restart_ranks(tuple(chosen), cause=f"restart(ranks={chosen})")
        return self._restart_all("restart()", automatic=False)

    def _restart_all(self, cause: str, *, automatic: bool) -> RestartRecord:
        started = time.monotonic()
        spawned = tuple(dict.fromkeys(r.name for r in self.spawned.values()))
        self._replacing_all = True  # the kill's "stopped" reads as "starting" meanwhile
        try:
            self.kill()
            self.start()
        finally:
            self._replacing_all = False
        for hook in list(self.after_restart):
            hook(self.shape.ranks)
        return self._restarted(self.shape.ranks, cause, automatic, (), spawned, started)

    def restart_ranks(
        self, ranks: tuple[int, ...], *, cause: str, automatic: bool = False
    ) -> RestartRecord:
        """Replace the processes of ``ranks`` only (dead or alive); the other ranks keep
        their namespaces and actors. The actors that lived on ``ranks`` are spawned
        again with the arguments they were first given; then the ``after_restart``
        hooks run (``--dist``: the process group is set up again on every rank).
        Blocking; raises MeshFailure if a new process does not start (those ranks
        stay dead), MeshUsageError if the mesh cannot be restarted in part."""
        unknown = [r for r in ranks if r not in self.shape.ranks]
        if not ranks or unknown:
            raise MeshUsageError(
                f"restart(ranks={list(ranks)!r}): process mesh {self.name!r} has ranks "
                f"{_describe_ranks(self.shape.ranks)}"
            )
        match self.state:
            case Stopped():
                raise MeshUsageError(
                    f"process mesh {self.name!r} was stopped; start a new one (restart(ranks=...) "
                    "brings back ranks of a running mesh)"
                )
            case Failed(error):
                raise MeshUsageError(
                    f"process mesh {self.name!r} failed as a whole ({error}); restart() replaces "
                    "every process"
                )
            case Starting():
                raise MeshUsageError(f"process mesh {self.name!r} is starting; wait for it")
        if self.agents is not None:
            raise MeshUsageError(
                f"process mesh {self.name!r} runs on several hosts: restart(ranks=...) is not "
                "supported there yet; restart() replaces every process"
            )
        with self._restart_lock:
            started = time.monotonic()
            self._replace(ranks, cause)
            respawned, to_spawn_again = self._respawn(ranks)
            for hook in list(self.after_restart):
                hook(ranks)
            return self._restarted(ranks, cause, automatic, respawned, to_spawn_again, started)

    def _replace(self, ranks: tuple[int, ...], cause: str) -> None:
        """Kill the processes of ``ranks`` and start new ones; wait for their hello."""
        error = MeshFailure(
            f"rank(s) {_describe_ranks(ranks)} of process mesh {self.name!r} are being "
            f"restarted ({cause})",
            ranks=ranks,
        )

        def mark() -> None:
            self._restarting.update(ranks)
            for rank in ranks:
                self._restart_failed.pop(rank, None)
            for actor_id, record in self.spawned.items():
                on = [r for r in ranks if r in record.ranks and r not in record.stopped]
                missing = self.missing_actors.setdefault(actor_id, {})
                for rank in on:
                    missing[rank] = f"it is being spawned again on rank {rank}, which restarted"

        self._end_ranks(ranks, error, mark)
        old = [self.workers[r] for r in ranks]
        for w in old:
            w.kill()
        for w in old:
            w.wait(KILL_WAIT_S)
        self._forget(old)

        def launch() -> list[LocalWorker]:
            if isinstance(self.state, Stopped | Failed):
                return []
            new = []
            for rank in ranks:
                self._incarnation[rank] = self._incarnation.get(rank, 0) + 1
                # Random, as at the start: a guessed name could be claimed first.
                identity = f"w{secrets.token_hex(16)}.{rank}.{self._incarnation[rank]}"
                self.ready_ranks.discard(rank)
                self.paused.discard(rank)
                self.rank_failures.pop(rank, None)
                self.controller.add_peer(identity.encode(), self, rank, None)
                worker = self._launch(rank, identity.encode(), self._key, self._env)
                self.workers[rank] = worker
                self._watch_one(worker)
                new.append(worker)
            return new

        new = self.controller.run(launch)
        if self.events.observed:
            for rank in ranks:
                self.events.emit(ev.RankStateChanged(self.name, rank, ev.RankState.STARTING))

        def settled() -> bool:
            if isinstance(self.state, Stopped | Failed):
                return True
            return all(r in self.ready_ranks or r in self._restart_failed for r in ranks)

        with self._ready_changed:
            self._ready_changed.wait_for(settled, START_TIMEOUT_S)
        if isinstance(self.state, Stopped | Failed):
            for w in new:
                w.kill()
            self._restarting.difference_update(ranks)
            raise self.failure_for(ranks) or MeshFailure(
                f"process mesh {self.name!r} stopped during a restart", ranks=ranks
            )
        failed = {r: self._restart_failed.get(r) for r in ranks if r not in self.ready_ranks}
        if failed:
            for w in new:
                if w.rank in failed:
                    w.kill()
            why = "; ".join(
                f"rank {r}: {text or f'no hello within {START_TIMEOUT_S} s'}"
                for r, text in failed.items()
            )
            lost = MeshFailure(
                f"could not restart rank(s) {_describe_ranks(tuple(failed))} of process mesh "
                f"{self.name!r} ({why}); they stay dead: call restart(ranks=...) again or "
                "restart()",
                ranks=tuple(failed),
            )

            def still_dead() -> None:
                for rank in failed:
                    self.dead[rank] = lost
                self._restarting.difference_update(ranks)

            self._end_ranks(tuple(failed), lost, still_dead)
            raise lost
        for rank in ranks:
            self.dead.pop(rank, None)
        self._restarting.difference_update(ranks)

    def spawn_again(self, actor_id: int, record: SpawnRecord, on: tuple[int, ...]) -> CallFuture:
        """Send the spawn of ``record`` again to ranks ``on``, with its old actor id (so
        references to it reach the new instances); a future of its completion."""
        message = functools.partial(
            Spawn,
            actor_id=actor_id,
            name=record.name,
            labels=record.labels,
            sizes=record.sizes,
            ranks=record.ranks,
        )
        return send_call(
            self,
            Shape(("ranks",), (len(on),), on),
            lambda call_id: message(call_id),
            (record.cls, record.args, record.kwargs),
            actor=f"{record.cls.__name__} {record.name!r}",
            error_class=SpawnError,
        ).future

    def _respawn(self, ranks: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Spawn again, on ``ranks``, the actors that lived there: (spawned again, failed)."""
        calls = []
        for actor_id, record in list(self.spawned.items()):
            on = tuple(r for r in ranks if r in record.ranks and r not in record.stopped)
            if not on:
                continue
            calls.append((actor_id, record, on, self.spawn_again(actor_id, record, on)))
        respawned: list[str] = []
        failed: list[str] = []
        for actor_id, record, on, future in calls:
            missing = self.missing_actors.setdefault(actor_id, {})
            try:
                future.get(timeout=START_TIMEOUT_S)
            except Exception as exc:
                for rank in on:
                    missing[rank] = (
                        f"spawning it again on rank {rank}, which restarted, failed "
                        f"({type(exc).__name__}: {exc}); spawn it again yourself"
                    )
                failed.append(record.name)
                continue
            for rank in on:
                missing.pop(rank, None)
            if not missing:
                del self.missing_actors[actor_id]
            respawned.append(record.name)
        return tuple(dict.fromkeys(respawned)), tuple(dict.fromkeys(failed))

    def _restarted(
        self,
        ranks: tuple[int, ...],
        cause: str,
        automatic: bool,
        respawned: tuple[str, ...],
        to_spawn_again: tuple[str, ...],
        started: float,
    ) -> RestartRecord:
        record = RestartRecord(
            time.time(),
            ranks,
            cause,
            automatic,
            respawned,
            to_spawn_again,
            time.monotonic() - started,
        )
        self.restarts.append(record)
        if self.events.observed:
            self.events.emit(
                ev.RanksRestarted(self.name, ranks, cause, automatic, respawned, to_spawn_again)
            )
        return record

    def _notify_restart(self) -> None:
        with self._ready_changed:
            self._ready_changed.notify_all()

    def _schedule_restart(self, ranks: tuple[int, ...], cause: str) -> None:
        """Have the policy's thread restart ``ranks`` (I/O thread: never blocks here)."""
        with self._ready_changed:
            for rank in ranks:
                self._pending_restart[rank] = cause
            if self._restarter is not None:
                return  # it takes these too, once done with the ones before
            self._restarter = threading.Thread(
                target=self._restart_loop, name=f"monarch_nb-restart-{self.name}", daemon=True
            )
        self._restarter.start()

    def _restart_loop(self) -> None:
        policy = self.restart_policy
        assert policy is not None
        while True:
            with self._ready_changed:
                pending, self._pending_restart = self._pending_restart, {}
                if not pending or isinstance(self.state, Stopped | Failed):
                    self._restarter = None
                    return
            cause = "; ".join(dict.fromkeys(pending.values()))
            try:
                if policy.ranks == "all":
                    self._restart_all(cause, automatic=True)
                else:
                    self.restart_ranks(tuple(sorted(pending)), cause=cause, automatic=True)
            except Exception as exc:
                if isinstance(self.state, Stopped | Failed):
                    continue
                self.fail(
                    MeshFailure(
                        f"process mesh {self.name!r}: the automatic restart after ({cause}) "
                        f"failed: {exc}; the mesh is failed: call restart()",
                        ranks=tuple(sorted(pending)),
                        cause=exc,
                    )
                )

    # -- control and observation (any thread) ---------------------------------------

    def interrupt(self, ranks: Iterable[int], call_id: int = 0) -> None:
        """Stop call ``call_id`` on ``ranks`` (0: whatever user code runs there): a
        KeyboardInterrupt if it runs, answered as interrupted if still queued.
        Through the ranks' wire threads, so it works while they are busy, on any
        host, and on a failed mesh's surviving ranks."""
        live = tuple(r for r in ranks if self.workers[r].returncode is None)
        if live:
            message = self.signer.encode(Interrupt(call_id))
            self.controller.send(self, live, message, even_if_failed=True)

    def kill_ranks(self, ranks: Iterable[int]) -> None:
        """SIGKILL ``ranks`` (a rank stuck in C ignores interrupts); the mesh fails."""
        for rank in ranks:
            worker = self.workers[rank]
            if worker.returncode is None:
                worker.kill()

    def query(self, ranks: tuple[int, ...]) -> Future[dict[int, StatusReply]]:
        """Ask ``ranks`` what their main thread runs, with its stack (answered by the
        wire thread, busy or not)."""
        future: Future[dict[int, StatusReply]] = Future()
        live = tuple(r for r in ranks if self.workers[r].returncode is None)
        if not live:
            future.set_result({})
            return future
        query_id = next(self._query_ids)
        self._queries[query_id] = (future, {}, len(live))
        message = self.signer.encode(StatusQuery(query_id))
        self.controller.send(self, live, message, even_if_failed=True)
        return future

    def end_query(self, future: Future[dict[int, StatusReply]]) -> dict[int, StatusReply]:
        """Give up on a query: the replies that did arrive (the rest never will)."""
        for query_id, (pending, replies, _) in list(self._queries.items()):
            if pending is future:
                del self._queries[query_id]
                return dict(replies)
        return future.get(timeout=0) if future.done() else {}

    def _on_status_reply(self, rank: int, reply: StatusReply) -> None:
        entry = self._queries.get(reply.query_id)
        if entry is None:
            return
        future, replies, expected = entry
        replies[rank] = reply
        if len(replies) == expected:
            del self._queries[reply.query_id]
            future.set_result(replies)

    def silent_ranks(self, ranks: Iterable[int]) -> dict[int, float]:
        """Of ``ranks``, those alive whose last heartbeat is older than
        ``SILENT_BEATS`` heartbeats, at least 3 s (rank -> seconds since it); any
        thread."""
        now = time.monotonic()
        silent_after = max(3.0, SILENT_BEATS * self.heartbeat_s)
        workers = self.workers
        silent = {}
        for rank in ranks:
            if rank >= len(workers) or workers[rank].returncode is not None:
                continue
            beat = workers[rank].heartbeat
            heard = beat[0] if beat is not None else workers[rank].started
            if now - heard > silent_after:
                silent[rank] = now - heard
        return silent

    def status(self, ranks: tuple[int, ...]) -> MeshStatus:
        """A snapshot of ``ranks`` (any thread; see :mod:`._status`)."""
        now = time.monotonic()
        mesh_state, failure = self._mesh_state(ranks)
        rows = []
        for rank in ranks:
            worker = self.workers[rank] if rank < len(self.workers) else None
            if worker is None:
                continue
            rows.append(self._rank_status(rank, worker, now))
        return MeshStatus(
            self.name,
            mesh_state,
            failure,
            self.shape,
            tuple(rows),
            self.controller.stats.snapshot(),
            time.time(),
            tuple(self.restarts),
        )

    def _mesh_state(self, ranks: tuple[int, ...] | None = None) -> tuple[MeshState, str | None]:
        """The state of the view over ``ranks`` (default: every rank): failed if one
        of them is dead, starting while one restarts."""
        match self.state:
            case Starting():
                return MeshState.STARTING, None
            case Running():
                view = self.shape.ranks if ranks is None else ranks
                if any(r in self._restarting for r in view):
                    return MeshState.STARTING, None
                error = self._rank_failure(view)
                if error is not None:
                    return MeshState.FAILED, str(error)
                return MeshState.RUNNING, None
            case Failed(error):
                return MeshState.FAILED, str(error)
            case Stopped():
                if self._replacing_all:
                    return MeshState.STARTING, None
                return MeshState.STOPPED, None
        raise AssertionError(self.state)

    def _rank_status(self, rank: int, worker: WorkerProcess, now: float) -> RankStatus:
        state = self.rank_state(rank)
        failure = self.rank_failures.get(rank)
        if worker.returncode is not None:
            failure = failure or worker.exit_cause()
        beat, before = worker.heartbeat, worker.previous_heartbeat
        sample = beat[1] if beat else None
        cpu = None
        if beat and before:  # the rank's own clock: a late delivery does not skew it
            elapsed = beat[1].sampled_at - before[1].sampled_at
            if elapsed > 0.05:
                cpu = 100.0 * (beat[1].cpu_seconds - before[1].cpu_seconds) / elapsed
        work, work_seconds = "", 0.0
        if state in (ev.RankState.BUSY, ev.RankState.PAUSED):
            if beat and worker.work:  # the rank's own word, aged by the time since it said it
                work, work_seconds = worker.work, worker.work_seconds + (now - beat[0])
            else:
                waiting = self.controller.calls_waiting_on(self, rank)
                work = waiting[0] if waiting else "call"
        return RankStatus(
            rank=rank,
            point=self.shape.point_of_rank(rank),
            host=self.hosts.get(rank, worker.host),
            pid=worker.pid,
            state=state,
            work=work,
            work_seconds=work_seconds,
            cpu_percent=cpu,
            rss_bytes=sample.rss_bytes if sample else None,
            gpu_memory_allocated=sample.gpu_memory_allocated if sample else None,
            gpu_memory_reserved=sample.gpu_memory_reserved if sample else None,
            gpu_utilization=sample.gpu_utilization if sample else None,
            heartbeat_age=(now - beat[0]) if beat else None,
            returncode=worker.returncode,
            failure=failure,
        )

    def output_tail(self, rank: int) -> list[ev.Output]:
        """The last lines ``rank`` wrote (up to ``OUTPUT_TAIL_LINES``), oldest first."""
        return list(self.workers[rank].output_tail)


def _plural_ranks(ranks: tuple[int, ...]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_describe_ranks(ranks)}"


def _describe_ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def check_gpus(count: int, available: int | None = None, host: str = "this host") -> bool:
    """Whether ``{"gpus": count}`` gives each rank a GPU of its own (default: on this host).

    A host with no GPU visible runs ``count`` CPU ranks under that dimension's name,
    as Monarch does (its programs and tests name the dimension ``gpus`` on CPU
    machines too), and says so once. A host with some GPUs, but fewer than
    ``count``, is refused: that is a mistake, not a CPU machine.
    """
    if available is None:
        available = len(visible_gpus())
    if available == 0:
        _tell_cpu_ranks(count, host)
        return False
    if count > available:
        raise MeshUsageError(
            f"per_host={{'gpus': {count}}} needs {count} GPUs but {host} has {available} "
            "visible; ask for fewer, or use {'procs': N} for CPU ranks"
        )
    return True


_told_cpu_ranks: set[str] = set()


def _tell_cpu_ranks(count: int, host: str) -> None:
    with _told_lock:
        if host in _told_cpu_ranks:
            return
        _told_cpu_ranks.add(host)
    _log.warning(
        "monarch_nb: %s has no GPU visible: per_host={'gpus': %d} starts %d CPU ranks "
        "(torch.cuda is not available on them)",
        host,
        count,
        count,
    )


def _tell_no_log_file(mesh: str, rank: int, why: str) -> None:
    """Warn once per reason (not once per rank) that ranks keep no log file."""
    with _told_lock:
        if why in _told_no_log_file:
            return
        _told_no_log_file.add(why)
    _log.warning(
        "monarch_nb: mesh %r keeps no rank log files, so procs.logs() will not find its "
        "lines (rank %d: %s). Set MONARCH_NB_LOG_DIR to a directory that only you own and "
        "can write (or unset it for ~/.monarch_nb/logs), then start the mesh again",
        mesh,
        rank,
        why,
    )
