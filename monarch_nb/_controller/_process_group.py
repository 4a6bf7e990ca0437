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

import importlib
import itertools
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._model._errors import MeshFailure, MeshStopped, MeshUsageError, SpawnError
from .._model._future import Future
from .._model._shape import Shape
from .._runtime import _context, _refs
from .._services import _logs
from .._wire._messages import CommToRank, DebugInput, DebugRefused, Message, StatusReply
from .._wire._network import visible_gpus
from .._wire._signed import Encoded, Signer
from . import _events as ev
from ._calls import CallFuture
from ._client import Controller
from ._group_status import mesh_status
from ._history import History
from ._launcher import Launcher
from ._lifecycle import Failed, SpawnRecord, Starting, State, Stopped, describe_ranks
from ._liveness import Liveness
from ._log_stream import OutputPrinter
from ._rank_output import RankOutput
from ._recovery import RestartBudget, RestartPolicy
from ._restarts import Restarter
from ._status import MeshStatus, RestartRecord
from ._telemetry import TelemetryHistory
from ._timeline import TimelineRecorder
from ._tree_reduce import fold_routes
from ._worker_messages import WorkerMessages
from ._workers import HEARTBEAT_S, START_TIMEOUT_S, STOP_GRACE_S, LocalWorker, WorkerProcess

if TYPE_CHECKING:
    from ._hosts import HostAgents

_log = logging.getLogger("monarch_nb")
_group_ids = itertools.count(1)
# START_TIMEOUT_S, HEARTBEAT_S and STOP_GRACE_S (imported above) are this module's
# own: config.configure() and tests set them here, and the roles read them at use
# through the group (start_timeout_s, configured_heartbeat_s, stop_grace_s).
# Modules every worker started from now on imports first and calls
# ``install_on_worker(worker)`` of: how layers above the core (the debugger)
# get onto the ranks without the core importing them. The debugger's is there
# by default: breakpoint() on a rank works without anything to call first.
WORKER_IMPORTS: list[str] = ["monarch_nb.debug._hook"]
# Makes the object that serves a group's pdb prompts (it subscribes to the
# group's Debugger* events); set by monarch_nb.debug.install(). Where unset,
# ``session_for`` of the module named here, imported at a rank's first pause.
DEBUGGER_FOR: Callable[[ProcGroup], object] | None = None
DEFAULT_DEBUGGER = "monarch_nb.debug._script"
_told_lock = threading.Lock()


class ProcGroup:
    """The processes of one ``spawn_procs`` (all its views share this object).

    It holds the state its roles share and answers the send path's checks
    itself; the rest is its roles' (see :mod:`._group_core`), which the methods
    below hand on to.
    """

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
        self.boot_extras: dict[str, Any] = {}  # what workers read at start (spawn_procs)
        self.gpus = gpus
        self.controller = controller
        self.controller.groups.add(self)
        self.events = ev.EventStream(name, controller.loop)
        self.rank_failures: dict[int, str] = {}  # rank -> its last failure, until its next call
        self.hosts: dict[int, str] = {}  # rank -> the host its hello came from
        self.peer_addresses: dict[int, str] = {}  # rank -> its TCP inbox (other hosts)
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
        self.all_ready = threading.Event()  # every rank said hello, or the start failed
        self.debugger: object | None = None  # see DEBUGGER_FOR
        self.paused: set[int] = set()  # ranks stopped in pdb, waiting for a line
        self.idle_since: dict[int, float] = {}  # rank -> when its last call in flight ended
        # Partial failure and restarts (see the module docstring).
        self.dead: dict[int, MeshFailure] = {}  # rank -> why it takes no calls
        self.restart_policy = restart
        self.spawned: dict[int, SpawnRecord] = {}  # actor id -> how to spawn it again
        # actor id -> the generation a replay spawned it again in: its old handles work
        self.replayed_actors: dict[int, int] = {}
        self.history = History()  # what built the ranks' state, for restart(replay=True)
        self.timeline = TimelineRecorder()  # who ran which call when: procs.timeline()
        self.telemetry = TelemetryHistory()  # resources and metrics over time
        self.missing_actors: dict[int, dict[int, str]] = {}  # actor id -> rank -> why absent
        # Run after ranks got fresh processes (restart(ranks=...) or a policy), with
        # those ranks: how the notebook sets torch.distributed up again.
        self.after_restart: list[Callable[[tuple[int, ...]], None]] = []
        self._env: dict[str, str] = {}
        self.restarting: set[int] = set()  # ranks whose new process has not said hello
        self.printer: OutputPrinter | None = None  # prints a script mesh's output
        # logging_option(): (stream_to_client, aggregate_window_sec), for every printer.
        self.output_option: tuple[bool, float | None] = (True, None)
        # Resizing (see ._resize): the inboxes processes adopted from an earlier
        # group bound under their old ranks (new rank -> address), and, in the
        # group they left, what it was resized into.
        self.inboxes: dict[int, str] = {}
        self.resized_into: str | None = None
        self.successor: ProcGroup | None = None  # stopping this group stops that one

        # The roles (see ._group_core), each with the state it owns.
        self.launcher = Launcher(self)
        self.messages = WorkerMessages(self)
        self.output = RankOutput(self)
        self.liveness = Liveness(self)
        self.restarter = Restarter(self, restart)

    # -- settings, read at use -------------------------------------------------------

    @property
    def start_timeout_s(self) -> float:
        return START_TIMEOUT_S

    @property
    def configured_heartbeat_s(self) -> float:
        return HEARTBEAT_S

    @property
    def stop_grace_s(self) -> float:
        return STOP_GRACE_S

    @property
    def worker_imports(self) -> list[str]:
        return WORKER_IMPORTS

    def new_debugger(self) -> object | None:
        """The object that serves this group's pdb prompts, or None if none is attached."""
        if DEBUGGER_FOR is not None:
            return DEBUGGER_FOR(self)
        if not DEFAULT_DEBUGGER:
            return None
        return importlib.import_module(DEFAULT_DEBUGGER).session_for(self)

    # -- routing and health (the send path reads these under the controller's lock) ---

    def identity(self, rank: int) -> bytes:
        return self.workers[rank].identity

    def routes(self, ranks: tuple[int, ...]) -> list[tuple[bytes | None, list[bytes]]]:
        """``ranks``' identities grouped by the agent that relays to them (None:
        direct), so a cast is one message per host (under the controller's lock)."""
        workers = self.workers
        if self.agents is None:
            return [(None, [workers[r].identity for r in ranks])]
        if self.agents.tree.active:  # a few subtrees' roots, each with its relay plan
            return self.agents.tree.routes(workers, ranks)  # type: ignore[return-value]
        by_route: dict[bytes | None, list[bytes]] = {}
        for r in ranks:
            worker = workers[r]
            by_route.setdefault(worker.route, []).append(worker.identity)
        return list(by_route.items())

    def fold_routes(self, ranks: tuple[int, ...], call: Any) -> list[tuple[bytes | None, Any]]:
        """As :meth:`routes`, for a reduced call: folded by the agents on the way."""
        return fold_routes(self, ranks, call)

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
                return MeshStopped(
                    f"process mesh {self.name!r} was stopped (`ProcMesh` has already been "
                    "stopped); start a new one or call restart()",
                    ranks=ranks,
                )
            case Starting():
                return MeshFailure(
                    f"process mesh {self.name!r} is starting (or restarting); call again once "
                    "spawn_procs() or restart() has returned",
                    ranks=ranks,
                )
        if self.dead or self.restarting:
            return self.rank_failure(ranks)
        return None

    def rank_failure(self, ranks: tuple[int, ...]) -> MeshFailure | None:
        """Why some of ``ranks`` take no calls (dead or restarting), or None."""
        restarting = [r for r in ranks if r in self.restarting]
        if restarting:
            return MeshFailure(
                f"rank(s) {describe_ranks(tuple(restarting))} of process mesh {self.name!r} "
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
            f"ranks {describe_ranks(tuple(errors))} of process mesh {self.name!r} are dead: "
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
            f"actor mesh {name!r} has no actor on rank(s) {describe_ranks(tuple(absent))}: {why}",
            ranks=tuple(absent),
        )

    def live_ranks(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """``ranks`` that can take calls now: neither dead nor restarting."""
        return tuple(r for r in ranks if r not in self.dead and r not in self.restarting)

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

    # -- status (any thread) -----------------------------------------------------------

    def status(self, ranks: tuple[int, ...]) -> MeshStatus:
        """A snapshot of ``ranks`` (any thread; see :mod:`._status`)."""
        return mesh_status(self, ranks)

    def output_tail(self, rank: int) -> list[ev.Output]:
        """The last lines ``rank`` wrote (up to ``OUTPUT_TAIL_LINES``), oldest first."""
        return list(self.workers[rank].output_tail)

    # -- launching (._launcher) ----------------------------------------------------------

    def start(self) -> None:
        """Start every worker and wait until each said hello (blocking)."""
        self.launcher.start()

    def ref(self) -> _refs.ProcsRef | None:
        """What a reference to this generation's processes carries; None while a
        rank on another host has not said where it listens."""
        return self.launcher.ref()

    def launch(
        self, rank: int, identity: bytes, key: bytes, base_env: dict[str, str]
    ) -> LocalWorker:
        return self.launcher.launch(rank, identity, key, base_env)

    def watch_one(self, w: LocalWorker) -> None:
        self.launcher.watch_one(w)

    # -- worker messages and relays (._worker_messages) ----------------------------------

    def on_worker_message(self, rank: int, message: Message, frames: list[Any]) -> None:
        """A worker's message other than a call's reply (I/O thread)."""
        self.messages.on_worker_message(rank, message, frames)

    def send_comm(self, rank: int, message: CommToRank) -> None:
        """Hand the notebook's message to a comm that ``rank`` opened (any thread)."""
        self.messages.send_comm(rank, message)

    def send_debug(self, rank: int, message: DebugInput | DebugRefused) -> None:
        """Answer ``rank``'s pdb prompt (any thread)."""
        self.messages.send_debug(rank, message)

    def query(self, ranks: tuple[int, ...]) -> Future[dict[int, StatusReply]]:
        """Ask ``ranks`` what their main thread runs, with its stack."""
        return self.messages.query(ranks)

    def end_query(self, future: Future[dict[int, StatusReply]]) -> dict[int, StatusReply]:
        """Give up on a query: the replies that did arrive (the rest never will)."""
        return self.messages.end_query(future)

    # -- output (._rank_output) ----------------------------------------------------------

    def read_output(self, worker: WorkerProcess, stream: str, pipe: Any) -> None:
        self.output.read(worker, stream, pipe)

    def on_output(self, worker: WorkerProcess, stream: str, chunk: bytes) -> None:
        """Bytes ``worker`` wrote to ``stream``, split into lines (I/O thread)."""
        self.output.on_output(worker, stream, chunk)

    def output_ended(self, worker: WorkerProcess, stream: str) -> None:
        """``stream`` of ``worker`` reached its end: emit a last unterminated line."""
        self.output.output_ended(worker, stream)

    def drain_output(self, worker: LocalWorker) -> None:
        self.output.drain(worker)

    # -- liveness, exits and stops (._liveness) ------------------------------------------

    def on_exit(self, worker: LocalWorker) -> None:
        self.liveness.on_exit(worker)

    def worker_exited(self, worker: WorkerProcess) -> None:
        """``worker`` is gone, its ``returncode`` set and its output read (I/O thread)."""
        self.liveness.worker_exited(worker)

    def host_lost(self, workers: list[WorkerProcess], host: str, why: str) -> None:
        """Every rank on ``host`` is gone at once (I/O thread)."""
        self.liveness.host_lost(workers, host, why)

    def end_ranks(
        self, ranks: tuple[int, ...], error: MeshFailure, mark: Callable[[], None]
    ) -> int:
        return self.liveness.end_ranks(ranks, error, mark)

    def fail(self, error: MeshFailure) -> None:
        """Mark the group failed and fail every call in flight to it (I/O thread)."""
        self.liveness.fail(error)

    def interrupt(self, ranks: Iterable[int], call_id: int = 0) -> None:
        """Stop call ``call_id`` on ``ranks`` (0: whatever user code runs there)."""
        self.liveness.interrupt(ranks, call_id)

    def kill_ranks(self, ranks: Iterable[int], why: str | None = None) -> None:
        """SIGKILL ``ranks`` (a rank stuck in C ignores interrupts); ``why``: on
        purpose, reported with that reason rather than as a crash."""
        self.liveness.kill_ranks(ranks, why)

    def silent_ranks(self, ranks: Iterable[int]) -> dict[int, float]:
        """Of ``ranks``, those alive whose heartbeat is overdue (rank -> seconds since it)."""
        return self.liveness.silent_ranks(ranks)

    def stop(self, grace: float | None = None) -> None:
        """Ask every worker to exit, kill what is left after ``grace`` s (blocking)."""
        self.liveness.stop(grace)

    def shut_down(self, workers: list[WorkerProcess], grace: float | None = None) -> None:
        """Ask ``workers`` to exit, kill those left after ``grace`` s, forget them."""
        self.liveness.shut_down(workers, grace)

    def kill(self) -> None:
        """Kill every worker at once (no grace), e.g. before a restart."""
        self.liveness.kill()

    def forget(self, workers: list[WorkerProcess]) -> None:
        self.liveness.forget(workers)

    # -- restarts (._restarts) -----------------------------------------------------------

    def restart(self, ranks: Iterable[int] | None = None) -> RestartRecord:
        """Replace every process with a fresh one, or only those of ``ranks``. Blocking."""
        return self.restarter.restart(ranks)

    def restart_ranks(
        self, ranks: tuple[int, ...], *, cause: str, automatic: bool = False
    ) -> RestartRecord:
        """Replace the processes of ``ranks`` only (see :meth:`Restarter.restart_ranks`)."""
        return self.restarter.restart_ranks(ranks, cause=cause, automatic=automatic)

    def spawn_again(self, actor_id: int, record: SpawnRecord, on: tuple[int, ...]) -> CallFuture:
        """Send the spawn of ``record`` again to ranks ``on``, with its old actor id."""
        return self.restarter.spawn_again(actor_id, record, on)

    def notify_restart(self) -> None:
        self.restarter.notify()

    def schedule_restart(self, ranks: tuple[int, ...], cause: str) -> None:
        self.restarter.schedule(ranks, cause)

    @property
    def restart_budget(self) -> RestartBudget | None:
        return self.restarter.budget

    @property
    def restart_failed(self) -> dict[int, str]:
        return self.restarter.restart_failed

    @property
    def replacing_all(self) -> bool:
        return self.restarter.replacing_all

    @property
    def restarts(self) -> deque[RestartRecord]:
        return self.restarter.records


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
