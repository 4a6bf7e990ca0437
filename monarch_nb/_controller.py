"""The controller client: one per process, lazily created, shared by every mesh.

It owns the ROUTER socket every worker connects to, the I/O thread that
receives on it, and the table of calls in flight.

Sending happens on the caller's thread, under ``_lock``: a call goes out
without waiting for another thread to wake up. The I/O thread polls the
socket's ``ZMQ_FD`` rather than the socket, and takes the same lock to drain
it, so the socket is only ever used by one thread at a time (zmq allows
moving a socket between threads behind a full memory barrier, which a lock
is). ``ZMQ_FD`` is edge-triggered: a send may consume the notification of a
message that just arrived, so a sender that sees pending input wakes the I/O
thread.

The same lock makes "is the group still healthy?" and "register the call"
one step, against the I/O thread's "mark the group failed and take its calls":
a crash can never slip between the check and the send.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from ._calls import PendingCall
from ._errors import MeshFailure, RemoteFailure
from ._io_loop import IOLoop
from ._wire import Encoded, WireStats, decode_payload, receive

_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)

if TYPE_CHECKING:
    from ._process_group import ProcGroup

_log = logging.getLogger("monarch_nb")
T = TypeVar("T")


@dataclass(frozen=True)
class WorkerOutput:
    """One line a worker wrote to its stdout or stderr."""

    rank: int
    stream: str  # "stdout" or "stderr"
    line: str
    mesh: str
    end: str = "\n"  # "\r" for a progress-bar update that the next one overwrites


def print_output(output: WorkerOutput) -> None:
    """Default output handler: the line, prefixed by its rank, on our own stream."""
    stream = sys.stderr if output.stream == "stderr" else sys.stdout
    stream.write(f"[{output.rank}] {output.line}{output.end}")
    stream.flush()


OutputHandler = Callable[[WorkerOutput], None]


class _Peer:
    __slots__ = ("group", "last_sequence", "rank")

    def __init__(self, group: ProcGroup, rank: int) -> None:
        self.group, self.rank, self.last_sequence = group, rank, 0


class Controller:
    """Process-wide client of every mesh this process started."""

    _instance: Controller | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> Controller:
        """The controller of this process, started on first use."""
        with cls._instance_lock:
            if cls._instance is None or cls._instance._pid != os.getpid():
                cls._instance = Controller()
            return cls._instance

    def __init__(self, bind_host: str | None = None) -> None:
        self._pid = os.getpid()
        self.bind_host = bind_host or os.environ.get("MONARCH_NB_BIND", "127.0.0.1")
        self.stats = WireStats()
        self.loop = IOLoop()
        self._peers: dict[bytes, _Peer] = {}
        self._calls: dict[int, PendingCall] = {}
        self._call_ids = itertools.count(1)
        # Calls in flight per (group id, rank), counted as they are sent, so
        # choose() sees a call the instant it was made.
        self.outstanding: Counter[tuple[int, int]] = Counter()
        self._lock = threading.Lock()
        self.output_handler: OutputHandler = print_output
        self.groups: weakref.WeakSet[ProcGroup] = weakref.WeakSet()
        atexit.register(self.shutdown)
        self.router: zmq.Socket = self.run(self._bind)
        self.address = self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    def _bind(self) -> zmq.Socket:
        router = self.loop.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.SNDHWM, 0)
        router.setsockopt(zmq.RCVHWM, 0)
        router.bind_to_random_port(f"tcp://{self.bind_host}")
        self.router = router
        self.loop.add_fd(router.getsockopt(zmq.FD), self._on_readable)
        return router

    # -- thread-safe API ------------------------------------------------------------

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the I/O thread and return its result (blocking)."""
        if self.loop.in_loop_thread:
            return fn()
        box: list[Any] = []
        done = threading.Event()

        def task() -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))
            done.set()

        self.loop.call_soon(task)
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def shutdown(self) -> None:
        """Kill every worker this process started (at interpreter exit)."""
        for group in list(self.groups):
            try:
                group.kill()
            except Exception:
                _log.exception("monarch_nb: could not stop %r at exit", group.name)
        self.loop.stop()

    def next_call_id(self) -> int:
        return next(self._call_ids)

    def send(
        self,
        group: ProcGroup,
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
        with self._lock:
            failure = None if even_if_failed else group.failure_for(ranks)
            if failure is None:
                if call is not None:
                    call.group = group
                    call.on_answer = self._rank_answered
                    call.on_finish = self._forget
                    self._calls[call.call_id] = call
                    for rank in ranks:
                        self.outstanding[(group.id, rank)] += 1
                router = self.router
                for rank in ranks:
                    message.send(router, group.identity(rank))
                self.stats.sent += len(ranks)
                pending_input = router.getsockopt(_EVENTS) & _POLLIN
        if failure is not None:
            if call is not None:
                call.fail(failure)
            return
        if pending_input:
            self.loop.call_soon(self._on_readable)

    def end_group(self, group: ProcGroup, state: Any, error: MeshFailure) -> int:
        """Move ``group`` to a final ``state``, failing its calls in flight with ``error``.

        Any thread. Returns how many calls were failed.
        """
        with self._lock:
            group.state = state
            calls = [c for c in self._calls.values() if c.group is group]
        for call in calls:
            call.fail(error)
        return len(calls)

    # -- I/O thread ---------------------------------------------------------------------

    def add_peer(self, identity: bytes, group: ProcGroup, rank: int) -> None:
        self._peers[identity] = _Peer(group, rank)

    def remove_peer(self, identity: bytes) -> None:
        self._peers.pop(identity, None)

    def calls_waiting_on(self, group: ProcGroup, rank: int) -> list[str]:
        """Labels of the calls in flight that still wait for ``rank`` (I/O thread)."""
        return [
            c.label for c in self._calls.values() if c.group is group and rank in c.waiting_ranks()
        ]

    def _rank_answered(self, call: PendingCall, rank: int) -> None:
        with self._lock:
            self._unload(call.group.id, rank)

    def _forget(self, call: PendingCall) -> None:
        with self._lock:
            self._calls.pop(call.call_id, None)
            for rank in call.waiting_ranks():  # those that answered were unloaded already
                self._unload(call.group.id, rank)

    def _unload(self, group_id: int, rank: int) -> None:
        key = (group_id, rank)
        self.outstanding[key] -= 1
        if self.outstanding[key] <= 0:
            del self.outstanding[key]

    def _on_readable(self) -> None:
        router = self.router
        while True:
            with self._lock:  # receive under the lock, handle outside it
                batch = []
                while len(batch) < 64 and (frames := receive(router)) is not None:
                    batch.append(frames)
            if not batch:
                return
            for frames in batch:
                self._dispatch(frames)

    def _dispatch(self, frames: list[Any]) -> None:
        peer = self._peers.get(frames[0].bytes)
        if peer is None:
            self.stats.dropped_unknown_peer += 1
            return
        body = frames[1:]
        checked = peer.group.signer.verify(body, peer.last_sequence)
        if checked is None:
            return
        peer.last_sequence, meta = checked
        kind = meta[0]
        if kind == "value":
            self._on_value(meta[1], peer.rank, body)
        elif kind == "failure":
            _, call_id, failure, serialization = meta
            call = self._calls.get(call_id)
            if call is not None:
                call.add_failure(failure, serialization=serialization)
        else:
            peer.group.on_worker_message(peer.rank, meta, body)

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


def set_output_handler(handler: OutputHandler | None) -> OutputHandler:
    """Route worker output lines to ``handler`` (None: the default printer).

    Returns the previous handler, so callers can restore it.
    """
    controller = Controller.get()
    previous = controller.output_handler
    controller.output_handler = handler or print_output
    return previous
