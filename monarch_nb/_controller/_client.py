"""The controller client: the ROUTER socket every worker connects to, and calls in flight.

Threads, and what each owns:

- **caller threads** (a notebook cell, a script) encode messages and send
  them themselves, under ``_lock``: a call goes out without waiting for
  another thread to wake up;
- **the I/O thread** (:mod:`._io_loop`) receives, verifies and dispatches
  messages, watches worker processes and pipes, and runs event observers;
- **a caller waiting in** ``get()`` receives for itself (one caller at a
  time): it takes replies off the local workers' socket and completes calls
  on its own thread, so a reply reaches the waiting caller with no hand-off
  from the I/O thread. It hands everything else it receives (heartbeats,
  failures, output, widget and debugger messages), and every message after
  one of those, to the I/O thread, in order. Meanwhile the I/O thread leaves
  that socket alone: it stops polling it when it sees a caller receiving and
  looks again at a short timer (``_REWATCH_S``), at once when the caller
  stops while other calls are in flight.

``_dispatch_lock`` is held by whichever thread verifies and dispatches the
workers' messages, so they are handled one at a time, in the order received.
``_lock`` guards the socket, the table of calls, the per-rank load counters
and every group's state. So "is the group healthy?" and "register the
call" are one step against the I/O thread's "mark the group failed and take
its calls": a crash can never slip between the check and the send. The
socket's ``ZMQ_FD`` is edge-triggered: a send may consume the notification of
a message that just arrived, so a sender that sees input pending wakes the
I/O thread.

One controller per process is the default (:meth:`Controller.get`); tests and
embedders may make their own and pass it to :func:`~monarch_nb.this_host`.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from .._model._errors import MeshFailure, MeshUsageError, RemoteFailure
from .._model._future import set_before_wait
from .._services import _config
from .._wire import _rundir
from .._wire._fd_limits import raise_fd_limit
from .._wire._handshake_guard import HandshakeGuard
from .._wire._messages import Failure, Message, UnknownMessage, Value
from .._wire._signed import (
    MAX_FRAME_BYTES,
    OWN,
    RELAY,
    Encoded,
    Receiver,
    WireStats,
    decode_payload,
)
from .._wire._sockets import socket_events
from .._wire._unix_link import LinkFrame, LinkRouter
from ._actor_failures import call_error
from ._agent_links import AgentLinks, close_guard, watch_guard
from ._calls import PendingCall
from ._client_receive import HANDLING_FAILED, CallerReceiver, Peer, Verified
from ._events import CallFinished, CallStarted, RankFailed, RankState, RankStateChanged
from ._fold_answers import FoldAnswers
from ._io_loop import IOLoop
from ._lifecycle import Failed, Stopped

if TYPE_CHECKING:
    from ._group_protocol import ClientGroup

_POLLIN = int(zmq.POLLIN)
# While a caller receives, the I/O thread looks at the workers' socket again
# after this long (work for nobody waits at most this much).
_REWATCH_S = 0.02
_log = logging.getLogger("monarch_nb")
T = TypeVar("T")


def _relay_envelope(identities: Any) -> bytes:
    """What an agent's relay starts with: its workers named (RELAY), or made already
    by the cast tree (bytes: ``_agent_tree``)."""
    if type(identities) is bytes:
        return identities
    return RELAY + b"\n".join(identities)


class Controller(CallerReceiver, FoldAnswers):
    """The client of every mesh one process started (see the module docstring)."""

    _default: Controller | None = None
    _default_lock = threading.Lock()

    @classmethod
    def get(cls) -> Controller:
        """The default controller of this process, started on first use."""
        with cls._default_lock:
            if cls._default is None or cls._default._pid != os.getpid():
                cls._default = Controller()
            return cls._default

    def __init__(self, bind_host: str | None = None) -> None:
        self._link_kind = _config.get("link")
        if self._link_kind not in ("unix", "zmq"):  # before anything starts
            raise MeshUsageError(
                f"MONARCH_NB_LINK={self._link_kind!r}: the controller's link to local workers "
                "is 'unix' (the default) or 'zmq'"
            )
        self._pid = os.getpid()
        raise_fd_limit()  # each endpoint it listens on holds an fd per connection
        self.bind_host = bind_host or os.environ.get("MONARCH_NB_BIND", "127.0.0.1")
        self.stats = WireStats()
        self.loop = IOLoop()
        self._peers: dict[bytes, Peer] = {}
        self._calls: dict[int, PendingCall] = {}
        self._call_ids = itertools.count(1)
        # Calls in flight per (group id, rank), counted as they are sent, so
        # choose() sees a call the instant it was made. A plain dict, no zeros
        # kept: a Counter's missing key and its del each ran Python per rank per call.
        self.outstanding: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self.groups: weakref.WeakSet[ClientGroup] = weakref.WeakSet()
        self.host_meshes: weakref.WeakSet[Any] = weakref.WeakSet()  # _hosts.HostAgents
        self._receivers: dict[zmq.Socket, Receiver] = {}  # per socket, under _dispatch_lock
        # Who receives from the local workers (see the module docstring):
        # Re-entrant: a handler on the I/O thread may restart or stop a mesh, which
        # changes the peer table (under this lock) from the same thread.
        self._dispatch_lock = threading.RLock()
        self._init_caller_receive()
        self._router_watched = True  # the I/O thread polls the router (I/O thread only)
        self._rewatch_due = False  # a _rewatch is scheduled (I/O thread only)
        # Verified messages a caller received, for the I/O thread to handle in order.
        self._handoff: deque[Verified] = deque()
        self._handoff_scheduled = False  # under _dispatch_lock
        self._closed = False  # the sockets are closed (shutdown)
        self._guard: HandshakeGuard | None = None  # where the network reaches the workers' socket
        # Host agents' links: a socket of their own, made when a host mesh needs one.
        self.agent_links = AgentLinks(self.loop, self._lock, self._drain_hosts, self._is_closed)
        atexit.register(self.shutdown)
        self.router: zmq.Socket = self.run(self._bind)
        self._link = self.router if isinstance(self.router, LinkRouter) else None
        if self._link is not None:
            _link_controllers.append(self)
            set_before_wait(_callers_wait)
        self.address = self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    def _bind(self) -> zmq.Socket:
        router, self._guard = _workers_socket(
            self.loop, self._link_kind, self.bind_host, self._is_closed
        )
        self.router = router
        self._router_fd = int(router.getsockopt(zmq.FD))
        self.loop.add_fd(self._router_fd, self._on_readable)
        return router

    # -- any thread -----------------------------------------------------------------

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the I/O thread and return its result (blocking)."""
        return self.loop.run(fn)

    def _is_closed(self) -> bool:
        return self._closed

    # The agents' links own these; kept here for the tests that reach them so.
    def bind_curve(self, host: str, server_public: str, server_secret: str) -> str:
        """Listen for agents on ``host`` too (:meth:`AgentLinks.bind_curve`)."""
        return self.agent_links.bind_curve(host, server_public, server_secret)

    @property
    def _hosts_guard(self) -> HandshakeGuard | None:
        return self.agent_links.guard

    def shutdown(self) -> None:
        """Kill every worker this controller started (at interpreter exit)."""
        if self.loop.stopping:
            return
        for group in list(self.groups):
            try:
                group.kill()
            except Exception:
                _log.exception("monarch_nb: could not stop %r at exit", group.name)
        for hosts in list(self.host_meshes):
            try:
                hosts.shutdown(grace=2.0)
            except Exception:
                _log.exception("monarch_nb: could not stop the agents of a host mesh at exit")

        if self in _link_controllers:
            _link_controllers.remove(self)

        def close() -> None:
            with self._lock:
                self._closed = True  # a receiving caller stops at its next look
            os.eventfd_write(self._caller_wake, 1)
            if self._guard is not None:
                close_guard(self.loop, self._guard)
            self.loop.remove_fd(int(self.router.getsockopt(zmq.FD)))
            self.router.close(0)
            self.agent_links.close()

        self.run(close)
        self.loop.stop()

    @property
    def send_lock(self) -> threading.Lock:
        """The lock every send holds while it reads a group's state, workers and
        signer: hold it to change them together (a restart)."""
        return self._lock

    def next_call_id(self) -> int:
        return next(self._call_ids)

    def send(
        self,
        group: ClientGroup,
        ranks: Iterable[int],
        message: Encoded,
        call: PendingCall | None = None,
        *,
        even_if_failed: bool = False,
    ) -> None:
        """Send one encoded message to ``ranks`` of ``group``; track ``call`` if given.

        If the group has failed or stopped, nothing is sent and ``call`` fails
        with the reason instead (``even_if_failed``: send anyway, for shutdown).
        """
        ranks = tuple(ranks)
        became_busy: list[int] = []
        with self._lock:
            failure = None if even_if_failed else group.failure_for(ranks)
            if failure is None and message.signer is not group.signer:
                failure = MeshFailure(
                    f"process mesh {group.name!r} restarted while this call was being sent "
                    "(it was signed for the old processes); call again",
                    ranks=ranks,
                )
            if failure is None:
                fold = call is not None and call.collect == "fold"  # replies folded on the way
                routes: Any = group.fold_routes(ranks, call) if fold else group.routes(ranks)
                if call is not None:
                    call.group, call.tracker = group, self
                    self._calls[call.call_id] = call
                    outstanding, gid = self.outstanding, group.id
                    if group.rank_failures:  # a new call clears a rank's "failed" state
                        for rank in ranks:
                            group.rank_failures.pop(rank, None)
                    group.timeline.began(call.call_id, call.label, ranks)
                    for rank in ranks:
                        key = (gid, rank)
                        load = outstanding[key] = outstanding.get(key, 0) + 1
                        if load == 1:
                            became_busy.append(rank)
                    events = group.events
                    if events.calls_observed:  # queued now, before any reply can be: in order
                        if events.wants(CallStarted):
                            events.post(CallStarted(group.name, call.call_id, call.label, ranks))
                        if became_busy and events.wants(RankStateChanged):
                            for rank in became_busy:
                                events.post(
                                    RankStateChanged(group.name, rank, RankState.BUSY, call.label)
                                )
                router = self.router
                frames = message.seal()  # in send order: see _wire's docstring
                behind = self._link is not None and self._write_behind()
                for via, identities in routes:
                    if via is None:
                        if behind:
                            router.write_behind = True
                        try:
                            message.send_each(router, identities, frames)
                        finally:
                            if behind:
                                router.write_behind = False
                    else:  # once per host, or per subtree (_agent_tree): its agent relays
                        router = self.agent_links.socket()
                        message.send(router, via, frames, _relay_envelope(identities))
                self.stats.sent += len(ranks)
                pending_input = socket_events(router) & _POLLIN
        if failure is not None:
            if call is not None:
                call.fail(call_error(group, call, failure))
            return
        if call is not None and group.events.calls_observed:
            group.events.flush_soon()
        if pending_input:
            self._input_pending()
            if self.agent_links.router is not None:
                self.loop.call_soon(self.agent_links.readable)

    def end_group(
        self, group: ClientGroup, state: Any, error: MeshFailure, *, unless_ended: bool = False
    ) -> int | None:
        """Move ``group`` to a final ``state``, failing its calls in flight with ``error``.

        Any thread. Returns how many calls were failed, or None if ``unless_ended``
        and the group had already failed or stopped (a crash racing a stop).
        """
        with self._lock:
            if unless_ended and isinstance(group.state, Failed | Stopped):
                return None
            group.state = state
            calls = [c for c in self._calls.values() if c.group is group]
        for call in calls:
            call.fail(call_error(group, call, error))
        return len(calls)

    def end_ranks(
        self, group: ClientGroup, ranks: Iterable[int], error: MeshFailure, mark: Callable[[], None]
    ) -> list[PendingCall]:
        """Some ranks of ``group`` are gone: ``mark()`` records it (under the lock, so
        no call to them slips in after), then every call in flight still waiting on
        one of them fails with ``error``. Calls to other ranks go on. Any thread;
        returns the calls failed."""
        gone = set(ranks)
        with self._lock:
            mark()
            calls = [
                c
                for c in self._calls.values()
                if c.group is group and gone.intersection(c.unanswered_ranks())
            ]
        for call in calls:
            call.fail(call_error(group, call, error))
        return calls

    def calls_waiting_on(self, group: ClientGroup, rank: int) -> list[str]:
        """Labels of the calls in flight that still wait for ``rank``, oldest first."""
        with self._lock:
            calls = [c for c in self._calls.values() if c.group is group]
        return [c.label for c in calls if rank in c.unanswered_ranks()]

    # -- per-rank bookkeeping of calls (any thread, under the lock) ---------------------

    def rank_answered(self, call: PendingCall, rank: int) -> None:
        with self._lock:
            if call.closed or rank in call.answered:
                return
            call.mark_answered(rank)
            idle = self._unload(call, rank)
            group = call.group
            if group is not None:
                failed = call.failures or call.serialization_failures  # most replies: neither
                group.timeline.answered(
                    call.call_id, rank, _failure_of(call, rank) if failed else None
                )
        if idle and group is not None and group.events.calls_observed:  # rank_settled says it
            group.rank_settled(rank)

    def call_finished(self, call: PendingCall, error: BaseException | None) -> None:
        with self._lock:
            if call.closed:
                return
            call.closed = True
            self._calls.pop(call.call_id, None)
            idle = [r for r in call.unanswered_ranks() if self._unload(call, r)]
        group = call.group
        if group is None:
            return
        summary = f"{type(error).__name__}: {error}".splitlines()[0] if error else None
        group.timeline.ended(call.call_id, summary)
        events = group.events
        if events.observed and events.wants(CallFinished):
            events.emit_soon(
                CallFinished(group.name, call.call_id, call.label, call.ranks, summary)
            )
        for rank in idle:
            group.rank_settled(rank)

    def last_answered(self, call: PendingCall, rank: int) -> None:
        """``rank_answered(call, rank)`` then ``call_finished(call, None)``, one lock
        and one timeline entry for both: what the last reply of most calls does."""
        with self._lock:
            if call.closed or rank in call.answered:
                return
            call.all_answered()
            call.closed = True
            self._calls.pop(call.call_id, None)
            idle = self._unload(call, rank)
        group = call.group
        if group is None:
            return
        group.timeline.answered_last(call.call_id, rank)
        events = group.events
        if not events.calls_observed:
            return
        if idle:
            group.rank_settled(rank)
        if events.wants(CallFinished):
            events.emit_soon(CallFinished(group.name, call.call_id, call.label, call.ranks, None))

    def _unload(self, call: PendingCall, rank: int) -> bool:
        """One call less in flight on ``rank``; True if it has none left (lock held)."""
        assert call.group is not None
        key = (call.group.id, rank)
        outstanding = self.outstanding
        left = outstanding.get(key, 0) - 1
        if left > 0:
            outstanding[key] = left
            return False
        outstanding.pop(key, None)
        call.group.idle_since[rank] = time.monotonic()
        return True

    # -- I/O thread ---------------------------------------------------------------------

    def add_peer(
        self, identity: bytes, group: ClientGroup, rank: int, via: bytes | None = None
    ) -> None:
        with self._dispatch_lock:  # a caller may be dispatching (see the docstring)
            self._peers[identity] = Peer(identity, group, rank, via)

    def move_peer(self, identity: bytes, group: ClientGroup, rank: int) -> None:
        """A worker now answers as ``rank`` of ``group`` (a resize); its replay
        window goes with it, since it keeps numbering its messages."""
        with self._dispatch_lock:
            peer = self._peers[identity]
            peer.group, peer.rank = group, rank

    def remove_peer(self, identity: bytes) -> None:
        with self._dispatch_lock:
            self._peers.pop(identity, None)

    def _on_readable(self) -> None:
        if self.caller_receiving:
            # A caller waits in get() and takes the replies itself: leave it the
            # socket, and poke it (this may be a sender's "input pending").
            self._unwatch_router()
            os.eventfd_write(self._caller_wake, 1)
            return
        self._drain(self.router, from_hosts=False)

    def _unwatch_router(self) -> None:
        """Stop polling the workers' socket while a caller receives; look again at
        a timer (I/O thread)."""
        if self._router_watched:
            self._router_watched = False
            self.loop.remove_fd(self._router_fd)
        if not self._rewatch_due:
            self._rewatch_due = True
            self.loop.call_later(_REWATCH_S, self._rewatch)

    def _rewatch(self) -> None:
        """Poll the workers' socket again once no caller receives (I/O thread)."""
        self._rewatch_due = False
        if self._closed:
            return
        if self.caller_receiving:
            self._unwatch_router()  # look again later
            return
        if not self._router_watched:
            self._router_watched = True
            self.loop.add_fd(self._router_fd, self._on_readable)
        self._drain(self.router, from_hosts=False)  # what came meanwhile: edge-triggered

    def _drain(self, router: zmq.Socket, *, from_hosts: bool) -> None:
        with self._dispatch_lock:
            if not from_hosts:
                self._run_handoff_locked()  # received before whatever the socket holds
            self._take_all(router, from_hosts, self._handle_safely)

    def _take_all(
        self,
        router: zmq.Socket,
        from_hosts: bool,
        handle: Callable[[Verified], None],
    ) -> None:
        """Take what ``router`` holds and ``handle`` each verified message
        (under _dispatch_lock)."""
        receiver = self._receivers.get(router)
        if receiver is None:
            receiver = self._receivers[router] = Receiver(router, self.stats)
        while True:
            # Receive under the lock, a bounded number of frames; handle outside it.
            with self._lock:
                if self._closed:
                    return
                batch, more = receiver.take()
            for frames in batch:
                verified = self._verify(frames, from_hosts)
                if verified is not None:
                    handle(verified)
            if not more:
                return

    def _drain_hosts(self, router: zmq.Socket) -> None:
        self._drain(router, from_hosts=True)

    def _hand_off(self, verified: Verified) -> None:
        """Queue a message a caller received for the I/O thread (lock held)."""
        self._handoff.append(verified)
        if not self._handoff_scheduled:
            self._handoff_scheduled = True
            try:
                self.loop.call_soon(self._run_handoff)
            except RuntimeError:  # shut down: nobody is left to handle it
                self._handoff.clear()

    def _run_handoff(self) -> None:
        with self._dispatch_lock:
            self._run_handoff_locked()

    def _run_handoff_locked(self) -> None:
        self._handoff_scheduled = False
        handoff = self._handoff
        while handoff:
            self._handle_safely(handoff.popleft())

    def _handle_safely(self, verified: Verified) -> None:
        # One bad message (or a done-callback that raises) must not stop the
        # messages after it, nor surface in an unrelated caller's get().
        try:
            self._handle(*verified)
        except Exception:
            _log.exception(HANDLING_FAILED)

    # -- handling what workers send (under _dispatch_lock) ------------------------------

    def _verify(self, frames: list[Any], from_hosts: bool) -> Verified | None:
        """Who sent ``frames`` and what, once every check passed; None otherwise
        (counted), or once an agent's own message was handed to it."""
        sender = frames[0]
        if sender.__class__ is not LinkFrame:  # a zmq.Frame (a LinkFrame is bytes already)
            sender = sender.bytes
        # Local workers speak on the local socket, agents on theirs: a name
        # claimed on the other socket is nobody's.
        peer = None if from_hosts else self._peers.get(sender)
        if peer is None:
            agent = self.agent_links.agents.get(sender) if from_hosts else None
            if agent is None or len(frames) < 2:
                self.stats.dropped_unknown_peer += 1
                return None
            frames = frames[1:]  # what the agent sent: its own, or a worker's relayed
            if frames[0].bytes == OWN:
                agent.on_message(frames[1:])
                return None
            peer = self._peers.get(frames[0].bytes)
            if peer is None or peer.via != sender:  # a host speaks for its own ranks only
                self.stats.dropped_unknown_peer += 1
                return None
        body = frames[1:]
        group = peer.group
        try:
            message = group.signer.verify(body, peer.window, sender=peer.tag)
        except UnknownMessage as exc:
            _log.error("monarch_nb: rank %d of %r sent %s", peer.rank, group.name, exc)
            return None
        if message is None:
            return None
        return peer, message, body

    def _handle(self, peer: Peer, message: Message, body: list[Any]) -> None:
        group = peer.group
        match message:
            case Value(call_id):
                self._on_value(call_id, peer.rank, body)
            case Failure(call_id, failure, serialization):
                call = self._calls.get(call_id)
                label = call.label if call is not None else ""
                group.note_failure(failure.rank, f"{failure.type_name}: {failure.message}")
                if group.events.observed:
                    group.events.emit(_rank_failed(group.name, failure, label))
                if call is not None:
                    call.add_failure(failure, serialization=serialization)
            case _:
                group.on_worker_message(peer.rank, message, body)

    def _on_value(self, call_id: int, rank: int, body: list[Any]) -> None:
        call = self._calls.get(call_id)
        if call is None:
            return  # the call already failed (mesh failure); a late reply is moot
        try:
            value = decode_payload(body)
        except Exception as exc:
            call.add_failure(
                RemoteFailure(
                    rank,
                    type(exc).__name__,
                    "the return value could not be unpickled on the controller: "
                    f"{type(exc).__name__}: {exc}",
                    "",
                ),
                serialization=True,
            )
            return
        call.add_value(rank, value)


def _workers_socket(
    loop: IOLoop, link_kind: str, bind_host: str, closed: Callable[[], bool]
) -> tuple[zmq.Socket, HandshakeGuard | None]:
    """The socket local workers connect to, bound, and its guard where the network
    reaches it (I/O thread)."""
    router = loop.context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.SNDHWM, 0)
    router.setsockopt(zmq.RCVHWM, 0)
    guard = None
    # Local workers reach us over a Unix socket in the tree's private (0700)
    # run directory: no other user can connect to it at all (a loopback port
    # would take anyone's frames), and it is faster than TCP.
    if "MONARCH_NB_BIND" in os.environ:  # asked for: a TCP port on that interface
        # Anyone who reaches it connects (no CURVE): frames are capped, and a
        # connection may bring 64 KiB until we have answered its signed hello.
        router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        guard = watch_guard(loop, router, "null", closed)
        router.bind_to_random_port(f"tcp://{bind_host}")
    elif link_kind == "unix":
        # Without libzmq (see _unix_link): the thread that sends writes, the
        # thread that receives reads, no hand-off to an I/O thread of its own.
        router.close()
        path = _rundir.socket_path(f"controller-{secrets.token_hex(8)}")
        router = LinkRouter(path[len("ipc://") :])  # type: ignore[assignment]
    else:
        router.bind(_rundir.socket_path(f"controller-{secrets.token_hex(8)}"))
    return router, guard


# Controllers of this process on a Unix link (most often one): a thread about to
# wait on a future has what it sent written first. A plain list, as it is read
# on every wait (atexit holds each controller until its shutdown anyway).
_link_controllers: list[Controller] = []


def _callers_wait() -> None:
    for controller in _link_controllers:
        controller.caller_waits()


def _rank_failed(mesh: str, failure: RemoteFailure, label: str) -> RankFailed:
    return RankFailed(
        mesh,
        failure.rank,
        f"{failure.type_name}: {failure.message}",
        traceback=failure.traceback,
        label=label,
    )


def _failure_of(call: PendingCall, rank: int) -> str | None:
    """``rank``'s error on ``call`` as "Type: message", None if it sent a value."""
    if not call.failures and not call.serialization_failures:
        return None  # the common case, on every reply
    for failure in itertools.chain(reversed(call.failures), reversed(call.serialization_failures)):
        if failure.rank == rank:
            return f"{failure.type_name}: {failure.message}".splitlines()[0]
    return None
