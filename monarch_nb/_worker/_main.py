"""The worker process: runs actors and cells on its main thread, one message at a time.

Started as ``python -m monarch_nb.worker`` with its bootstrap (address,
identity, signing key, rank) as one JSON line on stdin. The wire thread
(:mod:`._wire_thread`) receives every message and hands work here through a
queue, so calls to an actor start in the order they were sent; replies go out
from this thread directly. A call of an ``async def`` endpoint becomes a task
on the actors' event loop (:mod:`._endpoint_tasks`), which runs between messages:
such calls interleave at their awaits.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import inspect
import json
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import zmq

from .._common import _context, _metrics, _peer, _refs
from .._common._actors import is_concurrent, wants_response_port
from .._common._context import Context
from .._common._descendants import become_subreaper, kill_descendants
from .._common._dist import keep_store_on_loopback
from .._common._errors import (
    MeshFailure,
    MeshUsageError,
    RemoteError,
    RemoteFailure,
    never_constructed,
)
from .._common._fd_limits import raise_fd_limit
from .._common._future import set_wait_pump
from .._common._messages import (
    AWAITING_HEADING,
    BroadcastFailure,
    Call,
    Failure,
    Hello,
    Message,
    ProtocolError,
    Pull,
    Push,
    Renumber,
    RunCell,
    Shutdown,
    Spawn,
    StopActor,
    Supervision,
    Value,
)
from .._common._peer import PeerNode, PeerRoute
from .._common._serialize import dumps
from .._common._shape import Shape
from .._common._unix_link import SCHEME as LINK_SCHEME
from .._common._unix_link import LinkDealer
from .._common._wire import Signer, WireStats, decode_payload, sender_tag
from ._endpoint_tasks import TaskCall, Ticket, stepped, where_awaiting
from ._log_file import RankLog
from ._log_file import install as install_log_file
from ._wire_thread import WireThread

DEFAULT_HEARTBEAT_S = 1.0
# Messages the idle main thread receives at most before it runs the first.
_IDLE_DRAIN_BATCH = 64
# How long the idle main thread waits on the socket before it looks again anyway
# (a safety net: every message should wake it; the variable is for tests).
_IDLE_RECHECK_MS = int(os.environ.get("MONARCH_NB_IDLE_RECHECK_MS", "1000"))
# Frames of these files sit between the wire and user code: noise in a traceback.
_DISPATCH_FILES = frozenset(
    os.path.join(os.path.dirname(__file__), name)
    for name in ("_main.py", "_namespace.py", "_endpoint_tasks.py")
)
# Frames of waiting on a future (where a nested call's error was re-raised), and
# of the actor that applies ProcMesh.map's function: ours, not the user's.
_WAIT_FILES = frozenset(
    os.path.join(os.path.dirname(os.path.dirname(__file__)), "_common", name)
    for name in ("_future.py", "_pending.py", "_balance.py")
)


class _LiveActor:
    __slots__ = ("_endpoints", "context", "instance", "label", "tasks")

    def __init__(self, instance: Any, context: Context) -> None:
        self.instance = instance
        self.context = context
        self.label = type(instance).__name__
        self.tasks: set[TaskCall] = set()  # its async endpoint calls in flight
        self._endpoints: dict[str, _EndpointFacts] = {}

    def facts(self, endpoint: str, method: Any) -> _EndpointFacts:
        """What a call of ``endpoint`` (now ``method``) needs to know, looked up once
        per actor: asking a bound method for a mark it lacks costs more than a
        no-op call's own work (~0.7 us each, an AttributeError raised and
        cleared). Looked up again if the attribute became another function."""
        function = getattr(method, "__func__", method)
        facts = self._endpoints.get(endpoint)
        if facts is None or facts.function is not function:
            facts = self._endpoints[endpoint] = _EndpointFacts(
                function,
                f"{self.label}.{endpoint}",
                wants_response_port(method),
                is_concurrent(method) or inspect.iscoroutinefunction(method),
            )
        return facts


class _EndpointFacts(NamedTuple):
    function: Any  # what the endpoint's attribute was (a bound method's function)
    label: str  # "Trainer.step", for status and errors
    response_port: bool  # explicit_response_port: answers through a port
    concurrent: bool  # async def (or @concurrent_endpoint): a task on the actors' loop


class _ResponsePort:
    """What an ``explicit_response_port`` endpoint answers through: its call's reply."""

    __slots__ = ("_call_id", "_lock", "_route", "_sent", "_worker")

    def __init__(self, worker: Worker, route: Route, call_id: int) -> None:
        self._worker = worker
        self._route = route
        self._call_id = call_id  # 0 for a broadcast: nobody waits for an answer
        self._sent = False
        self._lock = threading.Lock()

    def _first(self) -> bool:
        with self._lock:
            first, self._sent = not self._sent and self._call_id != 0, True
        return first

    def send(self, value: Any) -> None:
        """Answer the call with ``value`` (the first answer counts)."""
        if self._first():
            self._worker.reply_value(self._call_id, value, self._route)

    def exception(self, exc: BaseException) -> None:
        """Answer the call with an error, as if the endpoint had raised ``exc``."""
        if self._first():
            self._route.send(Failure(self._call_id, self._worker.failure_of(exc), False))

    def fail(self, failure: RemoteFailure) -> None:
        """Answer the call with ``failure``, unless it was answered already."""
        if self._first():
            self._route.send(Failure(self._call_id, failure, False))

    def __reduce__(self):
        raise MeshUsageError(
            "an endpoint's response port answers its caller from this process; "
            "to answer elsewhere, pass a Port from Channel.open() instead"
        )


def _call_id_of(message: Message) -> int:
    """The call a work message answers (0 for a broadcast or a non-call)."""
    match message:
        case Call(call_id, _, _, True) | Spawn(call_id) | RunCell(call_id) | Push(call_id):
            return call_id
        case Pull(call_id) | Renumber(call_id):
            return call_id
    return 0


# A call as this rank knows it (a Ticket): (who sent it: b"" for the controller,
# else the peer's identity; its call id there). Call ids are only unique per caller.
_NO_TICKET: Ticket = (b"", 0)


class _ControllerRoute:
    """Replies to the controller's messages go back on the worker's own link."""

    __slots__ = ("send", "send_encoded", "send_small", "signer")

    def __init__(self, wire: WireThread, signer: Signer) -> None:
        self.send = wire.send
        self.send_encoded = wire.send_encoded
        self.send_small = wire.send_small
        self.signer = signer


Route = _ControllerRoute | PeerRoute

# to_wire(Value(call_id)) is (_VALUE_TAG, call_id): a reply's meta without the
# message object (a frozen dataclass, an interpreted __init__ and to_wire's two frames).
_VALUE_TAG = Value.TAG


# Result types no endpoint awaits (see Worker.user_code).
_NEVER_AWAITABLE = frozenset({bool, int, float, complex, str, bytes, tuple, list, dict, set})
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


class _Failed:
    """Stands in for a payload that could not be unpickled (already reported)."""


_FAILED = _Failed()


class Worker:
    """One worker's main thread: the work loop and the actors it runs."""

    def __init__(self, boot: dict[str, Any]) -> None:
        self.rank: int = boot["rank"]
        labels, sizes = boot["shape"]
        self.shape = Shape.from_sizes(dict(zip(labels, sizes, strict=False)))
        self.mesh_name: str = boot["mesh"]
        self.zmq = zmq.Context()
        if boot["address"].startswith(LINK_SCHEME):
            sock: Any = LinkDealer(boot["address"], boot["identity"].encode())
        else:
            sock = self.zmq.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, boot["identity"].encode())
            sock.setsockopt(zmq.LINGER, 2000)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(boot["address"])
        self.socket = sock
        self.signer = Signer(
            bytes.fromhex(boot["key"]),
            WireStats(),
            sender=sender_tag(boot["identity"].encode()),
            upstream=True,
            # A Unix socket in the private run directory (ours, or our host
            # agent's); a plain TCP port (MONARCH_NB_BIND) is not trusted.
            trusted_link=boot["address"].startswith(("ipc://", LINK_SCHEME)),
        )
        # (message, frames, its ticket, where replies go) from the wire thread or
        # the peer node, or a posted task.
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Written when work is put while the idle main thread waits on the socket
        # (see _receive_until_work); read by that wait.
        self._inbox_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # The work the idle main thread's own drain took (see _hold_or_deliver).
        self._held: Any = None
        self._hold_here = self._hold_or_deliver  # bound once: its drain passes it
        self._main_ident = threading.get_ident()  # made on the main thread
        self._waiting_on_socket = False
        _metrics.on_a_rank()  # log_metric() now records, for the heartbeats to carry
        self.wire = WireThread(
            sock,
            self.signer,
            deliver=self._deliver,
            busy=self.busy,
            interrupt=self.interrupt,
            controller_pid=boot["controller_pid"],
            heartbeat_s=float(boot.get("heartbeat_s", DEFAULT_HEARTBEAT_S)),
        )
        self.send = self.wire.send
        self.wire.wake_main = self._poke_main
        self.wire.describe_awaiting = self._describe_awaiting
        self.controller_route = _ControllerRoute(self.wire, self.signer)
        self.peer: PeerNode | None = None
        self.procs_ref: _refs.ProcsRef | None = None
        if "peer" in boot:  # actors elsewhere may call ours: bind our inbox
            peer = boot["peer"]
            self.procs_ref = _refs.ProcsRef.from_json(peer["ref"])
            _peer.set_tree_key(bytes.fromhex(peer["key"]))
            _peer.set_tree_curve(peer["curve"])
            if peer.get("tcp"):  # a mesh on several hosts: other hosts reach us by TCP
                host = os.environ.get("MONARCH_NB_RDMA_HOST") or "127.0.0.1"
                self.peer = PeerNode(None, _peer.tree_key(), tcp_host=host)
                self.procs_ref = dataclasses.replace(
                    self.procs_ref, table=_refs.compact_table({self.rank: self.peer.address})
                )
            else:
                self.peer = PeerNode(self.procs_ref.address(self.rank), _peer.tree_key())
            self.peer.on_work = self._deliver_from_peer
            self.peer.home = (self.procs_ref, self.rank)
            self.peer.on_interrupt = lambda sender, call_id: self.interrupt_ticket(
                (sender, call_id)
            )
            _peer.install_node(self.peer)
        self.actors: dict[int, _LiveActor] = {}
        # Actors whose __init__ raised here: a call to one answers that failure
        # (spawning does not wait, so calls sent meanwhile queue behind the spawn).
        self._failed_inits: dict[int, RemoteFailure] = {}
        self._loop: Any = None  # an asyncio loop, made for the first async endpoint
        self._fresh_tasks = False  # endpoint calls were made tasks since the loop last ran
        self._waker: Any = None  # an asyncio future the idle loop waits on for work
        # Serving other actors while one waits (see _pump): the actors running on
        # this thread now, innermost last, and work held back for them, in order.
        self._active: list[int] = []
        self._deferred: deque[Any] = deque()
        self.namespace: Any = None  # a _namespace.RankNamespace once a cell runs
        self.log: RankLog | None = None  # the rank's log file, flushed after user code
        self._idle_poller: Any = None  # select.poll of the socket and _inbox_fd
        self._in_user_code = False
        # What the main thread runs now and since when, for heartbeats and status:
        # one tuple, so the wire thread never reads a label with another's start.
        self._work: tuple[str, float] = ("", 0.0)
        # Which calls are queued, which runs, which to skip: interrupts target
        # one call (wire thread) while the main thread moves through the queue.
        self._calls_lock = threading.Lock()
        self._queued: dict[Ticket, Route] = {}
        self._running = _NO_TICKET
        self._interrupted = _NO_TICKET  # the running call, once an interrupt for it arrived
        self._skip: set[Ticket] = set()
        # The async endpoint calls in flight that have a caller waiting (a call id):
        # an interrupt of one cancels its task.
        self._task_calls: dict[Ticket, TaskCall] = {}
        signal.signal(signal.SIGINT, self._on_sigint)
        set_wait_pump(self._pump)
        _context.set_supervision_hook(self._on_child_failure)

    # -- what the main thread is doing (read by the wire thread) ----------------------

    def busy(self) -> tuple[str, float]:
        label, since = self._work
        return (label, time.monotonic() - since) if label else ("", 0.0)

    # -- interrupts of one call (wire thread) -----------------------------------------

    def _deliver(self, message: Message, frames: list[Any]) -> None:
        self._enqueue(message, frames, b"", self.controller_route)

    def _deliver_from_peer(self, message: Message, frames: list[Any], route: PeerRoute) -> None:
        self._enqueue(message, frames, route.sender, route)

    def _enqueue(self, message: Message, frames: list[Any], origin: bytes, route: Route) -> None:
        self._inbox.put(self._queued_item(message, frames, origin, route))
        self._wake()

    def _queued_item(self, message: Message, frames: list[Any], origin: bytes, route: Route) -> Any:
        """The work item of ``message``, its call queued (an interrupt can skip it)."""
        if message.__class__ is Call:  # most work: its id without pattern matching
            ticket = (origin, message.call_id if message.reply else 0)
        else:
            ticket = (origin, _call_id_of(message))
        if ticket[1]:
            with self._calls_lock:
                self._queued[ticket] = route
        return (message, frames, ticket, route)

    def _hold_or_deliver(self, message: Message, frames: list[Any]) -> None:
        """How the idle main thread's drain hands work on: the first piece, where
        nothing waits in the inbox before it, it keeps for itself (_held, taken
        by _receive_until_work), not through the inbox and back; the rest as
        :meth:`_deliver`. The drain lock keeps the wire thread from delivering
        meanwhile, so nothing of the controller's can come before it."""
        if self._held is None and self._inbox.empty():
            self._held = self._queued_item(message, frames, b"", self.controller_route)
        else:
            self._deliver(message, frames)

    def interrupt(self, call_id: int) -> None:
        """The controller's interrupt of ``call_id`` (0: whatever runs)."""
        self.interrupt_ticket((b"", call_id))

    def interrupt_ticket(self, ticket: Ticket) -> None:
        """Stop call ``ticket`` (call id 0: whatever runs): signal it if it runs; if it
        is still queued, answer it as interrupted now and skip it when its turn comes."""
        with self._calls_lock:
            route = self._queued.pop(ticket, None) if ticket[1] else None
            if route is not None:
                self._skip.add(ticket)
            elif ticket[1] == 0 or ticket == self._running:
                self._interrupted = self._running
                if ticket[1] == 0:  # whatever runs: async calls waiting at an await too
                    for waiting in list(self._task_calls.values()):
                        self._interrupt_task(waiting)
                call = self._task_calls.get(ticket) if ticket[1] else None
                if call is not None:  # a step of an async call runs: should the
                    # signal land after the step, the cancel stops it at its await
                    self._interrupt_task(call)
                # Signalled under the lock: the main thread cannot finish this call
                # (handle takes the lock at its end) and start the next before the
                # signal is sent. Sent after, it could land in the next call: a
                # KeyboardInterrupt there, or EINTR in its C code (torch's TCPStore
                # connect then backs off for tens of seconds: a rendezvous after a
                # rank died stalled so).
                self.wire.interrupt_main()
                return
            else:
                call = self._task_calls.get(ticket)
                if call is not None:  # an async call, waiting at an await
                    self._interrupt_task(call)
                return  # else already answered: nothing to stop
        failure = RemoteFailure(
            self.rank, "KeyboardInterrupt", "interrupted before it started on this rank", ""
        )
        route.send(Failure(ticket[1], failure, False))

    def _interrupt_task(self, call: TaskCall) -> None:
        """Cancel async call ``call`` where it awaits (any thread; its task then
        answers its caller as interrupted)."""
        call.interrupted = True
        try:
            self._loop.call_soon_threadsafe(call.cancel)
        except RuntimeError:
            pass  # the loop closed: the worker is exiting

    def reply_value(self, call_id: int, value: Any, route: Route | None = None) -> None:
        route = route or self.controller_route
        try:
            # As Signer.encode pickles it (None: no payload bytes at all).
            payload, buffers = dumps(value, by_value=False) if value is not None else (b"", [])
            message = None
            if buffers:  # frames beside the body (tensors, arrays): encoded as ever
                message = route.signer.encode_pickled(Value(call_id), payload, buffers)
        except Exception as exc:
            failure = RemoteFailure(
                self.rank,
                type(value).__name__,
                f"the return value ({type(value).__name__}) cannot be pickled: {exc}",
                "",
            )
            route.send(Failure(call_id, failure, True))
            return
        if message is None:  # most replies: a small value, sealed and sent in one step
            if route.send_small((_VALUE_TAG, call_id), payload):
                return
            message = route.signer.encode_pickled(Value(call_id), payload, buffers)
        route.send_encoded(message)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # An interrupt is meant for user code. Raised anywhere else (between
        # calls, or while a reply is being sent) it would lose a reply.
        if self._in_user_code:
            raise KeyboardInterrupt

    def user_code(
        self,
        label: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] = _NO_KWARGS,
        *,
        awaits: bool = True,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` with interrupts enabled (main thread),
        labelled for status; an awaitable it returns (an ``async def`` endpoint)
        runs to its end on the actors' loop, unless ``awaits`` is False."""
        self._work = (label, time.monotonic())
        self._in_user_code = True
        wire = self.wire
        if wire.status_held:  # a status asked meanwhile describes this
            wire.release_status()
        try:
            if self._interrupted[1] and self._interrupted == self._running:
                raise KeyboardInterrupt  # it came while the arguments were unpickled
            result = fn(*args, **kwargs)
            # The common results skip isawaitable: its check against the Awaitable ABC
            # runs two interpreted frames, on every call that returns a value.
            if (
                awaits
                and result is not None
                and result.__class__ not in _NEVER_AWAITABLE
                and inspect.isawaitable(result)
            ):
                result = self.run_async(result)
            return result
        finally:
            self._in_user_code = False
            self._work = ("", 0.0)
            log = self.log
            if log is not None and log.dirty:  # before the reply: a kill after it loses no line
                log.flush()

    def post(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the main thread between messages (any thread may call)."""
        self._inbox.put(task)
        self._wake()

    # -- the actors' event loop runs between messages -----------------------------------

    def _next_item(self) -> Any:
        """The next work item; while tasks of the actors' event loop are pending
        (async endpoint calls, tasks they created), they run meanwhile. Tasks
        made by the last message take their first step before the next is taken
        (the loop runs its ready tasks in the order they were made)."""
        loop = self._loop
        if loop is not None:
            import asyncio  # only once an async endpoint made the loop: workers start lean

            if self._fresh_tasks:  # their first steps, and no more: most short calls
                # end there, and the idle thread can then wait on the socket itself
                self._fresh_tasks = False
                loop.call_soon(loop.stop)
                loop.run_forever()
            if asyncio.all_tasks(loop):
                self.wire.watch()
                return loop.run_until_complete(self._next_item_async())
        while self._deferred:
            item = self._deferred.popleft()
            if item is not _WAKE:
                return item
        return self._receive_until_work()

    def _receive_until_work(self) -> Any:
        """The idle main thread waits on the socket itself and drains it, so a call
        reaches the code that runs it without a hand-off between threads (on a
        busy host each costs about as much as the work of a small call). Work
        from elsewhere (the peer node, posted tasks) wakes it through _inbox_fd."""
        inbox, wire = self._inbox, self.wire
        if not inbox.empty():  # this thread is the only one that takes from it
            return inbox.get_nowait()
        poller = self._idle_poller
        if poller is None:
            poller = self._idle_poller = select.poll()
            poller.register(wire.socket_fd, select.POLLIN)
            poller.register(self._inbox_fd, select.POLLIN)
        try:
            # Before the first poll, a drain only where the poll could miss input.
            look = wire.main_begins_receiving()
            timed_out = False
            while True:
                self._waiting_on_socket = True
                # What came while nobody watched first (a zmq socket's fd is
                # edge-triggered), then what the poll announced. A batch at most:
                # the first piece of work waits for no more than that. Not behind
                # the wire thread's drain: its deliveries wake us.
                more: bool | None = False
                if look:
                    try:
                        more = wire.drain(
                            at_most=_IDLE_DRAIN_BATCH, wait=False, deliver=self._hold_here
                        )
                    except Exception:  # a bug here must not stop the rank: say it, go on
                        traceback.print_exc()
                        # What the batch took after the one that raised waits in
                        # the rank, where no poll announces it: go on with it now.
                        # (Not a busy loop: each raise consumed its own message.)
                        more = wire.holds_taken()
                    held = self._held
                    if held is not None:  # first in line: nothing waited in the inbox
                        self._held = None
                        if timed_out:
                            self._missed_wakeup()
                        return held
                look = True
                if timed_out and (more or not inbox.empty()):
                    self._missed_wakeup()
                if not inbox.empty():
                    return inbox.get_nowait()
                if more:  # a batch of control messages only: the rest gives no notice
                    continue
                if wire.status_held:  # idle: a status asked meanwhile says so
                    wire.release_status()
                # With a deadline all the same: were a notice ever missed, the
                # rank would answer a second late rather than never (and say so).
                ready = poller.poll(_IDLE_RECHECK_MS)
                timed_out = not ready
                for fd, _ in ready:
                    if fd == self._inbox_fd:
                        self._waiting_on_socket = False
                        os.eventfd_read(self._inbox_fd)
        finally:
            self._waiting_on_socket = False
            wire.main_stops_receiving()

    def _missed_wakeup(self) -> None:
        """Work waited for the idle main thread's deadline: a wake-up was lost
        somewhere. Counted (``WireStats.missed_wakeups``); said once on stderr."""
        stats = self.signer.stats
        stats.missed_wakeups += 1
        if stats.missed_wakeups == 1:
            print(
                "monarch_nb: a message waited for the idle rank's 1 s recheck (a lost "
                "wake-up, answered late, not lost): please report it",
                file=sys.stderr,
                flush=True,
            )

    def _wake(self) -> None:
        """New work in the inbox: wake whichever wait the main thread is in."""
        if self._waker is not None:  # it waits in the actors' event loop
            self._wake_loop()
        if self._waiting_on_socket and threading.get_ident() != self._main_ident:
            self._poke_main()

    def _poke_main(self) -> None:
        os.eventfd_write(self._inbox_fd, 1)

    async def _next_item_async(self) -> Any:
        loop = self._event_loop()
        deferred = self._deferred  # held back while the main thread waited: first
        while deferred:
            item = deferred.popleft()
            if item is not _WAKE:
                return item
        while True:
            try:
                return self._inbox.get_nowait()
            except queue.Empty:
                pass
            self._waker = loop.create_future()
            try:
                try:  # put before the waker was visible to the putting thread
                    return self._inbox.get_nowait()
                except queue.Empty:
                    pass
                await self._waker
            finally:
                self._waker = None

    # -- serving other actors while one waits ------------------------------------------

    def _pump(self, future: Any, timeout: float | None) -> None:
        """The main thread waits on ``future``: until it is done (or ``timeout``),
        run the calls that arrive for *other* actors of this process (an actor
        that calls another actor of its own process would otherwise wait
        forever). Work for a waiting actor, cells and tasks are held back, in
        order, until the main thread is free."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def wake(_: Any) -> None:
            self._inbox.put(_WAKE)
            self._wake_loop()

        future.add_done_callback(wake)
        self.wire.watch()  # this thread waits on its inbox now, not on the socket
        while not future.done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            try:
                item = self._inbox.get(timeout=remaining)
            except queue.Empty:
                return
            self._serve_nested(item)

    def _serve_nested(self, item: Any) -> None:
        if item is _WAKE:
            return
        if callable(item) or not self._nestable(item[0]):
            self._deferred.append(item)
            return
        saved = (self._running, self._interrupted, self._work, self._in_user_code)
        try:
            self.handle(*item)
        finally:
            self._running, self._interrupted, self._work, self._in_user_code = saved

    def _nestable(self, message: Message) -> bool:
        match message:
            case Call(_, actor_id):
                return actor_id not in self._active
            case Spawn():
                return True
        return False

    async def _task_or_item(self, task: Any) -> None:
        """Wait until ``task`` is done or work arrives for the main thread."""
        import asyncio

        if not self._inbox.empty():
            return
        self._waker = asyncio.get_running_loop().create_future()
        try:
            if self._inbox.empty():
                await asyncio.wait([task, self._waker], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waker = None

    def _serve_arrived(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._serve_nested(item)

    def _wake_loop(self) -> None:
        waker = self._waker
        if waker is not None:
            try:
                waker.get_loop().call_soon_threadsafe(_resolve, waker)
            except RuntimeError:
                pass  # the loop closed: the main thread is not waiting in it

    # -- the loop -------------------------------------------------------------------

    def run(self) -> None:
        self.wire.start()
        tcp = self.peer.tcp_address if self.peer is not None else ""
        self.send(Hello(os.getpid(), socket.gethostname(), tcp))
        while True:
            if self._loop is None and not self._deferred:  # (what _next_item does first)
                item = self._receive_until_work()
            else:
                item = self._next_item()
            if item is _WAKE:
                continue
            if callable(item):
                item()
            elif not self.handle(*item):
                return

    def handle(self, message: Message, frames: list[Any], ticket: Ticket, route: Route) -> bool:
        """Handle one work message; False means shut down."""
        if ticket[1]:  # a call reaches the front, unless an interrupt skipped it
            with self._calls_lock:
                self._queued.pop(ticket, None)
                if ticket in self._skip:
                    self._skip.discard(ticket)
                    return True  # interrupted while queued: already answered
                self._running = ticket
                self._interrupted = _NO_TICKET
        try:
            if message.__class__ is Call:  # most work: no pattern matching to run
                self.on_call(message, frames, route)
                return True
            return self._handle(message, frames, route)
        finally:
            with self._calls_lock:
                self._running = self._interrupted = _NO_TICKET
            if self.wire.status_held:  # work that never reached user code
                self.wire.release_status()

    def _handle(self, message: Message, frames: list[Any], route: Route) -> bool:
        from_controller = route is self.controller_route
        match message:
            case Call():
                self.on_call(message, frames, route)
            case Spawn():
                self.on_spawn(message, frames, route)
            case RunCell() | Push() | Pull() if from_controller:
                self.on_cell(message, frames)
            case Renumber(call_id) if from_controller:
                self.on_renumber(call_id, frames)
            case StopActor(actor_id, call_id):
                live = self.actors.pop(actor_id, None)
                if live is not None:
                    self._cleanup(live)
                if call_id:  # the stop's future: done once __cleanup__ has run
                    route.send(Value(call_id))
            case Shutdown() if from_controller:
                for actor_id in list(self.actors):
                    self._cleanup(self.actors.pop(actor_id))
                self._stop_loop_tasks()
                return False
            case _:
                self.send(ProtocolError(f"a worker does not handle {type(message).__name__}"))
        return True

    def _decode_or_fail(
        self,
        call_id: int,
        reply: bool,
        label: str,
        frames: list[Any],
        actor_id: int = 0,
        route: Route | None = None,
    ) -> Any:
        try:
            return decode_payload(frames)
        except Exception as exc:
            self._undecodable(exc, call_id, reply, label, actor_id, route)
            return _FAILED

    def _undecodable(
        self,
        exc: Exception,
        call_id: int,
        reply: bool,
        label: str,
        actor_id: int = 0,
        route: Route | None = None,
    ) -> None:
        """Answer a message whose arguments raised ``exc`` when unpickled."""
        failure = RemoteFailure(
            self.rank,
            type(exc).__name__,
            f"the arguments could not be unpickled: {type(exc).__name__}: {exc} "
            "(is the module that defines them importable on the workers?)",
            "",
        )
        self._report(call_id, reply, actor_id, label, failure, route, serialization=True)

    def on_spawn(self, message: Spawn, frames: list[Any], route: Route) -> None:
        call_id, name = message.call_id, message.name
        decoded = self._decode_or_fail(call_id, True, f"spawn of {name!r}", frames, 0, route)
        if decoded is _FAILED:
            return
        cls, args, kwargs = decoded
        shape = Shape(message.labels, message.sizes, message.ranks)
        ctx = Context(
            shape.point_of_rank(self.rank),
            len(shape),
            self.mesh_name,
            name,
            actor_id=message.actor_id,
            procs=self.procs_ref,
            shape=shape,
        )
        previous = _context.set_current(ctx)
        self._active.append(message.actor_id)
        try:
            instance = self.user_code(
                f"spawn {name!r}", _construct, (cls, args, kwargs), awaits=False
            )
        except BaseException as exc:
            failure = self.failure_of(exc)
            self._failed_inits[message.actor_id] = failure
            route.send(Failure(call_id, failure, False))
            return
        finally:
            self._active.pop()
            _context.set_current(previous)
        self.actors[message.actor_id] = _LiveActor(
            instance, dataclasses.replace(ctx, actor=instance)
        )
        route.send(Value(call_id))

    def on_call(self, message: Call, frames: list[Any], route: Route) -> None:
        call_id, actor_id, endpoint, reply = (
            message.call_id,
            message.actor_id,
            message.endpoint,
            message.reply,
        )
        live = self.actors.get(actor_id)
        if live is not None:
            try:  # the actor's own code may run here (a property, __getattribute__)
                method = getattr(live.instance, endpoint, None)
                facts = live.facts(endpoint, method)
            except Exception as exc:  # the call's error, not the rank's end
                label = f"{live.label}.{endpoint}"
                self._report(call_id, reply, actor_id, label, self.failure_of(exc), route)
                return
            label = facts.label
        else:
            label = f"actor.{endpoint}"
        try:
            args, kwargs = decode_payload(frames)
        except Exception as exc:
            self._undecodable(exc, call_id, reply, label, actor_id, route)
            return
        if live is None:
            failed = self._failed_inits.get(actor_id)
            if failed is not None:
                self._report(call_id, reply, actor_id, label, never_constructed(failed), route)
                return
            error = LookupError(
                f"no actor {actor_id} on rank {self.rank}: it was stopped, or its spawn has "
                "not reached this rank yet (a mesh passed on before actors.initialized was done)"
            )
            self._report(call_id, reply, actor_id, label, self.failure_of(error), route)
            return
        if facts.response_port:
            args = (_ResponsePort(self, route, call_id if reply else 0), *args)
            reply = False  # the endpoint answers through the port
        ctx = live.context
        if message.sent_to:
            labels, sizes, ranks = message.sent_to
            ctx = dataclasses.replace(ctx, message_shape=Shape(labels, sizes, ranks))
        if facts.concurrent and method is not None:
            self._start_task(live, ctx, method, args, kwargs, message, label, reply, route)
            return
        previous = _context.set_current(ctx)
        self._active.append(actor_id)
        try:
            if method is None:  # (raises: the attribute is missing)
                method = getattr(live.instance, endpoint)
            result = self.user_code(label, method, args, kwargs)
        except BaseException as exc:
            self._report(call_id, reply, actor_id, label, self.failure_of(exc), route)
            return
        finally:
            self._active.pop()
            _context.set_current(previous)
        if reply:
            self.reply_value(call_id, result, route)

    def _start_task(
        self,
        live: _LiveActor,
        ctx: Context,
        method: Any,
        args: tuple,
        kwargs: Mapping[str, Any],
        message: Call,
        label: str,
        reply: bool,
        route: Route,
    ) -> None:
        """An ``async def`` endpoint's call: its body becomes a task on the actors'
        loop, and the next message is taken once the body first awaits. The reply
        (if ``reply``: False for a broadcast, or where a response port answers)
        leaves when it ends; its failure is its own call's."""
        import asyncio

        loop = self._event_loop()
        call_id, actor_id = message.call_id, message.actor_id
        ticket = self._running if message.reply else _NO_TICKET
        call = TaskCall(ticket, actor_id, label, ctx, time.monotonic())

        async def run() -> None:
            call.started = True
            _context.set_task_context(ctx)
            try:
                if call.stopping or call.interrupted:  # before its body began
                    raise asyncio.CancelledError
                call.coro = method(*args, **kwargs)
                result = await stepped(call.coro, call, self._enter_step, self._leave_step)
            except asyncio.CancelledError as exc:
                failure = self._cancelled(call, exc)
                if reply or not call.stopping:
                    self._report(call_id, reply, actor_id, label, failure, route)
                elif args and isinstance(args[0], _ResponsePort):
                    args[0].fail(failure)  # its caller may still wait on the port
                # (else a broadcast: nobody waits, and a stop fails no actor mesh)
            except BaseException as exc:
                self._report(call_id, reply, actor_id, label, self.failure_of(exc), route)
            else:
                if reply:
                    self.reply_value(call_id, result, route)
            finally:
                live.tasks.discard(call)
                if ticket[1]:
                    with self._calls_lock:
                        self._task_calls.pop(ticket, None)

        if ticket[1]:
            with self._calls_lock:
                self._task_calls[ticket] = call
                # Interrupted while its arguments were unpickled: it ends as it starts.
                call.interrupted = self._interrupted == ticket
        call.task = loop.create_task(run())
        live.tasks.add(call)
        self._fresh_tasks = True

    def _enter_step(self, call: TaskCall) -> Any:
        """A step of async call ``call`` begins: it is the running call until
        :meth:`_leave_step` (what this returns is what that restores)."""
        saved = (
            self._running,
            self._interrupted,
            self._work,
            self._in_user_code,
            _context.set_current(call.context),
        )
        self._active.append(call.actor_id)
        with self._calls_lock:
            self._running, self._interrupted = call.ticket, _NO_TICKET
        self._work = (call.label, call.since)
        self._in_user_code = True
        if self.wire.status_held:  # a status asked meanwhile describes this
            self.wire.release_status()
        return saved

    def _leave_step(self, saved: Any) -> None:
        # Out of user code first: an interrupt signal that lands from here on is
        # dropped, not raised in the worker's code (the call's cancel stands in).
        self._in_user_code = False
        running, interrupted, work, in_user_code, context = saved
        with self._calls_lock:
            self._running, self._interrupted = running, interrupted
        self._active.pop()
        self._work = work
        self._in_user_code = in_user_code
        _context.set_current(context)
        log = self.log
        if log is not None and log.dirty:
            log.flush()

    def _describe_awaiting(self) -> str:
        """(wire thread) Below a status's stack: the async endpoint calls in flight
        whose step is not running, and where each awaits. Not in the stack's
        format, so that ``%mesh why`` reads the main thread's frames only."""
        running = self._running
        lines = []
        for live in list(self.actors.values()):
            for call in list(live.tasks):
                if call.ticket[1] and call.ticket == running:
                    continue  # its step runs: the stack above shows it
                place = where_awaiting(call, _not_user_code)
                lines.append(f"  {call.label} awaits at {place}" if place else f"  {call.label}")
        if not lines:
            return ""
        return f"{AWAITING_HEADING}{len(lines)}):\n" + "\n".join(sorted(lines)) + "\n"

    def _cancelled(self, call: TaskCall, exc: BaseException) -> RemoteFailure:
        """The failure an async call reports when its task was cancelled."""
        if call.stopping:
            failure = self.failure_of(exc)
            return dataclasses.replace(
                failure, message=f"{call.label} was cancelled: its actor was stopped"
            )
        if call.interrupted:
            return self.failure_of(KeyboardInterrupt().with_traceback(exc.__traceback__))
        return self.failure_of(exc)

    def _cleanup(self, live: _LiveActor) -> None:
        """A stopped actor: cancel its async calls in flight and let them unwind
        (their ``except CancelledError`` and ``finally`` run), then ``__cleanup__(None)``."""
        self._stop_tasks(live.tasks)
        cleanup = getattr(live.instance, "__cleanup__", None)
        if cleanup is None:
            return
        previous = _context.set_current(live.context)
        try:
            self.user_code(f"{live.label}.__cleanup__", cleanup, (None,))
        except BaseException as exc:
            failure = self.failure_of(exc)
            self.send(BroadcastFailure(live.context.actor_id, f"{live.label}.__cleanup__", failure))
        finally:
            _context.set_current(previous)

    def _stop_tasks(self, calls: set[TaskCall]) -> None:
        """Cancel ``calls`` and run the actors' loop until their tasks have ended
        (serving calls to other actors meanwhile: a handler may await one)."""
        if not calls:
            return
        import asyncio

        tasks = []
        for call in list(calls):
            call.stopping = True
            call.cancel()
            tasks.append(call.task)
        if not self._loop.is_running():  # (else they unwind as the loop goes on)
            self.run_async(asyncio.wait(tasks))

    def _stop_loop_tasks(self) -> None:
        """The worker exits: cancel the tasks endpoints left on the actors' loop
        (after every actor's ``__cleanup__``) and let them unwind."""
        loop = self._loop
        if loop is None or loop.is_running():
            return
        import asyncio

        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.run_async(asyncio.wait(tasks))

    def _report(
        self,
        call_id: int,
        reply: bool,
        actor_id: int,
        label: str,
        failure: RemoteFailure,
        route: Route | None = None,
        *,
        serialization: bool = False,
    ) -> None:
        if reply:
            (route or self.controller_route).send(Failure(call_id, failure, serialization))
        else:  # a broadcast has no caller: supervision (the controller) takes it
            self.send(BroadcastFailure(actor_id, label, failure))

    def on_renumber(self, call_id: int, frames: list[Any]) -> None:
        """This process moved into a resized mesh: take its new rank, shape,
        environment and inbox table. The actors of the old mesh are stopped
        (their meshes cannot follow a renumbering); the namespace is kept."""
        decoded = self._decode_or_fail(call_id, True, "renumber", frames)
        if decoded is _FAILED:
            return
        self.rank = decoded["rank"]
        self.shape = Shape.from_sizes(dict(zip(decoded["labels"], decoded["sizes"], strict=True)))
        os.environ.update(decoded["env"])
        if self.peer is not None:
            self.procs_ref = decoded["ref"]
            self.peer.home = (self.procs_ref, self.rank)
        for actor_id in list(self.actors):
            self._cleanup(self.actors.pop(actor_id))
        self._failed_inits.clear()
        # torch.distributed's default group was made for the old world (its size,
        # ranks and store): leave it, so the next init_process_group() (a cell, the
        # tensor engine) makes the new one. Only if torch is loaded: never import it.
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        if self.namespace is not None:
            self.namespace.renumber()
        self.reply_value(call_id, None)

    def on_cell(self, message: RunCell | Push | Pull, frames: list[Any]) -> None:
        call_id = message.call_id
        match message:
            case RunCell(_, filename):
                label = filename
            case Pull(_, name):
                label = f"pull {name!r}"
            case _:
                label = "push"
        decoded = self._decode_or_fail(call_id, True, label, frames)
        if decoded is _FAILED:
            return
        if self.namespace is None:
            from ._namespace import RankNamespace

            self.namespace = RankNamespace(self)
        ns = self.namespace
        previous = _context.set_current(ns.context)
        try:
            match message:
                case RunCell(_, filename):
                    result = self.user_code(f"cell {filename}", ns.execute, (filename, decoded))
                case Push():
                    ns.globals.update(decoded)
                    result = None
                case Pull(_, name):
                    result = ns.pull(name)
        except BaseException as exc:
            self.send(Failure(call_id, self.failure_of(exc), False))
            return
        finally:
            _context.set_current(previous)
        self.reply_value(call_id, result)

    def _event_loop(self) -> Any:
        if self._loop is None:
            import asyncio  # here: workers start without asyncio

            self._loop = asyncio.new_event_loop()
        return self._loop

    def run_async(self, awaitable: Any) -> Any:
        import asyncio

        task = asyncio.ensure_future(awaitable, loop=self._event_loop())
        self.wire.watch()  # this thread waits in the actors' loop now, not on the socket
        try:
            while True:
                self._loop.run_until_complete(self._task_or_item(task))
                if task.done():
                    return task.result()
                self._serve_arrived()  # other actors' calls, while this one awaits
        except BaseException:
            # Interrupted (or failed) mid-await: unwind the coroutine now, so it
            # does not resume inside a later call on this loop.
            if not task.done():
                task.cancel()
                try:
                    self._loop.run_until_complete(task)
                except BaseException:
                    pass
            raise

    def failure_of(self, exc: BaseException) -> RemoteFailure:
        # Kept where pdb.pm() looks, for post-mortem debugging on the rank.
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _DISPATCH_FILES:
            tb = tb.tb_next
        summary = traceback.TracebackException(type(exc), exc, tb)
        summary.stack = traceback.StackSummary.from_list(
            # Dispatch frames inside user code too: the SIGINT handler raising
            # KeyboardInterrupt is the last frame of an interrupt.
            [f for f in summary.stack if f.filename not in _WAIT_FILES | _DISPATCH_FILES]
        )
        text = "".join(summary.format())
        if isinstance(exc, RemoteError):  # a call this actor made failed: show where
            text += f"--- {exc.target} was called from here, and failed:\n{exc.render()}\n"
        try:
            message = str(exc)
        except Exception as broken:  # a user exception whose __str__ raises
            message = f"<str() of the exception failed: {type(broken).__name__}: {broken}>"
        return RemoteFailure(self.rank, type(exc).__name__, message, text)

    # -- supervision of meshes our actors started -------------------------------------

    def _on_child_failure(self, owner: Any, error: MeshFailure) -> None:
        self.post(lambda: self._supervise(owner, error))

    def _supervise(self, owner: Any, error: MeshFailure) -> None:
        # As an endpoint call of the owner: its context, interruptible, and an
        # ``async def __supervise__`` awaited on the actor's loop.
        live = next((a for a in self.actors.values() if a.instance is owner), None)
        previous = _context.set_current(live.context if live else None)
        label = f"{type(owner).__name__}.__supervise__"
        # The owner's own calls wait until it has handled the failure (it may
        # spawn a new child mesh meanwhile), as they wait for its sync endpoints.
        self._active.append(live.context.actor_id if live else 0)
        try:
            handled = self.user_code(label, owner.__supervise__, (error,))
            why = f"its __supervise__ returned {handled!r}"
        except BaseException as exc:
            handled = False
            why = f"its __supervise__ raised {type(exc).__name__}: {exc}"
        finally:
            self._active.pop()
            _context.set_current(previous)
        if not handled:
            self.send(Supervision(f"{type(owner).__name__} did not handle ({why}): {error}"))


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _not_user_code(filename: str) -> bool:
    """Frames that say nothing of where user code awaits: monarch_nb's, asyncio's."""
    if filename.startswith(_PACKAGE_DIR):
        return True
    asyncio = sys.modules.get("asyncio")  # loaded: a call awaits
    where = getattr(asyncio, "__file__", None)
    return where is not None and filename.startswith(os.path.dirname(where))


# Put in the inbox to wake a waiting main thread (a future it waits on completed).
_WAKE = object()


def _resolve(waker: Any) -> None:
    if not waker.done():
        waker.set_result(None)


def _construct(cls: type, args: tuple, kwargs: dict) -> Any:
    """``cls(*args, **kwargs)``, with the instance current while its ``__init__`` runs,
    so a process mesh it starts there is owned (supervised) by it."""
    if type(cls).__call__ is not type.__call__:
        return cls(*args, **kwargs)  # a metaclass that constructs in its own way
    instance = cls.__new__(cls, *args, **kwargs)
    if isinstance(instance, cls):
        spawning = _context.context()
        _context.set_current(dataclasses.replace(spawning, actor=instance))
        try:
            type(instance).__init__(instance, *args, **kwargs)
        finally:
            _context.set_current(spawning)
    return instance


def _no_debugger(*args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` on a rank whose controller serves no debugger prompt."""
    raise RuntimeError(
        "breakpoint() on a rank needs a debugger prompt on the controller, and this "
        "mesh was started without one: in a script call monarch_nb.debug.install() "
        "before spawn_procs() (a notebook's %load_ext monarch_nb does it); "
        "PYTHONBREAKPOINT=0 makes breakpoint() do nothing"
    )


def _die_with_parent(controller_pid: int) -> None:
    """SIGKILL this process the instant its controller dies (Linux's parent-death
    signal): no orphans even while user code holds the GIL. The wire thread's
    ``getppid()`` check stays as the fallback where prctl is missing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != controller_pid:  # it died before prctl took effect
        os._exit(70)


_PR_SET_PDEATHSIG = 1


_this_worker: Worker | None = None


def live_actor(actor_id: int) -> tuple[Any, Context, Callable[[Any], Any]] | None:
    """The instance and context of actor ``actor_id`` if it lives in this process, and
    what runs its coroutines (the actors' event loop): for layers above the core that
    call a neighbour directly (the tensor engine's rref)."""
    worker = _this_worker
    live = worker.actors.get(actor_id) if worker is not None else None
    if worker is None or live is None:
        return None
    return live.instance, live.context, worker.run_async


def _quiet_torch_without_numpy() -> None:
    """Keep torch's "Failed to initialize NumPy" warning out of every rank's output.

    torch's CPU wheel installs no numpy, and ``import torch`` then warns on
    each rank, which reads like an error in the cell. Nothing here needs numpy
    (tensors cross the wire without it), and user code calling ``.numpy()``
    still gets torch's own error saying numpy is missing.
    """
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


def main() -> None:
    global _this_worker
    # Interrupts are how calls stop: whatever mask or disposition the process
    # that launched us had (a blocked or ignored SIGINT is inherited), take
    # SIGINT back for the main thread.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    boot = json.loads(sys.stdin.buffer.readline())
    _die_with_parent(boot["controller_pid"])
    # What user code starts stays in this rank's tree, even after a setsid and its
    # parent's exit, to be killed with it (see _common._descendants).
    become_subreaper()
    keep_store_on_loopback()  # torch's store would listen on every interface
    raise_fd_limit()  # user code may open many; the agent or controller raised it already
    # A segfault or abort prints every thread's Python stack to fd 2, which the
    # controller reads to the end before it reports the death.
    faulthandler.enable(file=2, all_threads=True)
    _quiet_torch_without_numpy()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # user code calling input() gets EOF, not our bootstrap pipe
    os.close(devnull)
    log = install_log_file(boot["mesh"], boot["rank"])
    worker = _this_worker = Worker(boot)
    worker.log = log
    if not os.environ.get("PYTHONBREAKPOINT"):
        # stdin is /dev/null: pdb would quit at once (a bare BdbQuit). The
        # debugger's install_on_worker below replaces this with its prompt.
        sys.breakpointhook = _no_debugger
    # Layers above the core that must be in place before user code runs (the
    # debugger's breakpoint hook): each module's install_on_worker(worker).
    for name in boot.get("imports", ()):
        importlib.import_module(name).install_on_worker(worker)
    code = 0
    try:
        worker.run()
    except BaseException:
        traceback.print_exc()  # a bug in the loop itself: say it, and exit non-zero
        code = 70
    finally:
        kill_descendants(os.getpid())  # nothing a rank started outlives it
        sys.stdout.flush()
        sys.stderr.flush()
        worker.wire.stop()
        if worker.peer is not None:
            worker.peer.close()
        with worker.wire.lock:
            worker.socket.close()
        if code:
            os._exit(code)
    # Asked to stop: end as Python ends, so that atexit handlers and module
    # globals' __del__ run, as on Monarch's graceful stop. A thread that user
    # code left running would hold that exit forever: a deadline ends it.
    _exit_after(_FINALIZE_S, code)
    sys.exit(code)


# How long a stopped worker's interpreter may take to finalize (the controller's
# grace, STOP_GRACE_S, is longer: it kills what is left after that).
_FINALIZE_S = 3.0


def _exit_after(seconds: float, code: int) -> None:
    """``os._exit(code)`` in ``seconds``, from a daemon thread, unless the process
    has exited by then."""

    def wait_then_exit() -> None:
        time.sleep(seconds)
        os._exit(code)

    threading.Thread(target=wait_then_exit, name="monarch_nb-exit", daemon=True).start()
