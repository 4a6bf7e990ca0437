"""The worker's wire thread: it owns receiving, so the wire flows while user code runs.

Threads of a worker, and what each owns::

    main thread    runs work (spawns, calls, cells, push/pull) one message at a
                   time, in the order sent, and sends their replies itself;
                   receives while it is idle (below)
    wire thread    receives and verifies every message otherwise; answers control
                   messages (Interrupt, StatusQuery), even while the
                   main thread is busy in user code or stopped in pdb; sends
                   heartbeats with a resource sample; exits the process when
                   the controller is gone

Who receives: while the main thread is idle it waits on the socket itself
and drains it (a call then reaches the code that runs it with no hand-off
between threads, which on a busy host costs about as much as a small call);
the wire thread meanwhile polls only its timers and wake-up fd. When the
main thread has work, the wire thread takes the socket back lazily: at its
next timer (within ``_WATCH_INTERVAL_S``), at once when the main thread is
about to wait on something else (``watch()``: a nested call's reply, the
actors' event loop, the debugger's prompt), or when a send saw input
pending. So a control message that comes while user code runs (an
interrupt, a status query) is answered within that interval, and a run of
small calls to a rank with no asyncio task pending does not wake the wire
thread (with one pending, the main thread waits in the actors' loop, and
the wire thread receives).
Either drains under ``_drain_lock``, from receiving to handing on, so
messages keep their order; control messages are handled as they are
received, except a status query the main thread receives, which the wire
thread answers (on the main thread it would describe the drain, not the call
just taken). The idle main thread drains at most a batch before it runs
what it received.

Both send. The socket is used under ``lock`` only (zmq lets a socket move
between threads behind a full memory barrier, which a lock is). Its
``ZMQ_FD`` is edge-triggered, and a send can consume the notification of a
message that just arrived, so a sender that sees input pending wakes whoever
receives now.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from .._services import _metrics
from .._wire._eventfd import clear_eventfd
from .._wire._messages import (
    Call,
    Heartbeat,
    Interrupt,
    Message,
    ProtocolError,
    StatusQuery,
    StatusReply,
    UnknownMessage,
)
from .._wire._signed import CONTROLLER, Receiver, ReplayWindow, Signer
from .._wire._sockets import send_one, socket_events
from .._wire._unix_link import LinkDealer
from . import _resources
from ._frames import DISPATCH_FILES

_POLLIN = int(zmq.POLLIN)
# Messages a drain takes off the socket at a time (control messages are handled
# as they come; work waits in order in the main thread's inbox).
_DRAIN_BATCH = 64
_WATCH_INTERVAL_S = 0.2  # how often the controller's liveness is checked
# A status's stack waits at most this long for the main thread to leave these
# files (the worker's dispatch) for the work it has begun.
_INTO_WORK_S = 0.5
_DISPATCH_FILES = DISPATCH_FILES | {os.path.join(os.path.dirname(__file__), "_wire_thread.py")}


class WireThread:
    """Receives for the worker; see the module docstring for who owns what."""

    def __init__(
        self,
        socket: zmq.Socket,
        signer: Signer,
        *,
        deliver: Callable[[Message, list[Any]], None],
        busy: Callable[[], tuple[str, float]],
        interrupt: Callable[[int], None],
        controller_pid: int,
        heartbeat_s: float,
    ) -> None:
        self.socket = socket
        # A Unix link (its fd is level-triggered), asked directly on a rank's every
        # call; None on zmq.
        self._link = socket if isinstance(socket, LinkDealer) else None
        self.signer = signer
        self._receiver = Receiver(socket, signer.stats)
        self._taken: deque[list[Any]] = deque()  # taken off the socket, not handled yet
        self.lock = threading.Lock()
        self._deliver = deliver  # hands work to the main thread
        self._busy = busy  # (what the main thread runs, since when), "" when idle
        self._interrupt = interrupt  # stop one call (or whatever runs): the worker decides
        self._controller_pid = controller_pid
        self._heartbeat_s = heartbeat_s
        self._window = ReplayWindow()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._main_ident = threading.main_thread().ident
        self.socket_fd = int(socket.getsockopt(zmq.FD))  # read once, before threads share it
        # Who drains the socket holds this from receiving to delivering, so two
        # drainers (this thread, the idle main thread) keep messages in order.
        self._drain_lock = threading.Lock()
        # Who watches the socket (see "Who receives" in the module docstring):
        self.main_receiving = False  # the idle main thread waits on it itself
        self._receive_epoch = 0  # how many times the main thread began to
        self._watch_requested = False  # the main thread waits on something else
        self._parked = False  # this thread is not watching the socket now
        self.wake_main: Callable[[], None] = lambda: None  # the worker sets it
        # What a status adds after the main thread's stack (the worker sets it: its
        # async endpoint calls in flight, and where each awaits).
        self.describe_awaiting: Callable[[], str] = lambda: ""
        # Status queries the main thread received, for this thread to answer once
        # the main thread says its state is worth describing (release_status). Public:
        # the main thread reads it before calling that, a call fewer on its path.
        self._control_backlog: deque[Message] = deque()
        self.status_held = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="monarch_nb-wire", daemon=True)
        # Set by the thread itself, first thing (Thread.ident is a property, and set
        # after start() returned, a drain the thread began before would not know it).
        self._thread_ident: int | None = None
        # Message type -> handler run here on the wire thread, for layers above the
        # core (the debugger feeds pdb's input while the main thread waits in it).
        self.control_handlers: dict[type[Message], Callable[[Message], None]] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        os.eventfd_write(self._wake_fd, 1)

    # -- any thread -------------------------------------------------------------------

    def send(self, message: Message, payload: Any = None) -> None:
        self.send_encoded(self.signer.encode(message, payload, by_value=False))

    def send_encoded(self, encoded: Any) -> None:
        """Send an encoded message; or, given a function, send what it encodes under
        the lock that orders this rank's sends (see :meth:`_heartbeat`)."""
        with self.lock:
            if callable(encoded):
                encoded = encoded()
            encoded.send(self.socket)
            pending = socket_events(self.socket) & _POLLIN
        if pending:
            self._input_noticed()

    def send_small(self, meta: tuple[Any, ...], payload_bytes: bytes) -> bool:
        """Seal and send the message ``meta`` (:func:`to_wire`'s tuple) with its
        payload pickled (no buffer frames) in one step, as :meth:`send_encoded`
        would (a reply's path: a dozen interpreted steps fewer); False, nothing
        sent, where it is too big for that."""
        with self.lock:
            link = self._link
            if link is not None:  # sealed and written in one C step
                events = link.send_small(self.signer, meta, payload_bytes)
                if events is None:
                    return False
            else:
                frame = self.signer.seal_small(meta, payload_bytes)
                if frame is None:
                    return False
                events = send_one(self.socket, frame)
            pending = events & _POLLIN
        if pending:
            self._input_noticed()
        return True

    def _input_noticed(self) -> None:
        # The send may have taken the notice of a message that just arrived: make
        # whoever receives now look (this thread included: it polls next). The
        # main thread between two pieces of work (a reply) receives next itself.
        if self.main_receiving:
            self.wake_main()
        elif not (
            threading.current_thread() is threading.main_thread()
            and not self._watch_requested
            and not self._busy()[0]
        ):
            os.eventfd_write(self._wake_fd, 1)

    # -- who receives (main thread) ---------------------------------------------------

    def main_begins_receiving(self) -> bool:
        """The main thread is idle and waits on the socket itself from now on.

        True if a message may wait that a poll of the socket's fd would not
        announce, so it drains before its first poll: one taken and not yet
        handed on, one a Unix link already read and parsed, or anything on a zmq
        socket (its fd is edge-triggered). A Unix link's fd is level-triggered:
        with nothing held here, a poll says whether the kernel holds input, and a
        drain first would only ask it in vain (about a tenth of a small call's
        work on the rank)."""
        self._watch_requested = False
        self._receive_epoch += 1
        self.main_receiving = True
        link = self._link
        return bool(self._taken) or link is None or bool(link.events() & _POLLIN)

    def holds_taken(self) -> bool:
        """Whether messages taken off the socket wait here to be handed on (a drain
        that raised left them)."""
        return bool(self._taken)

    def main_stops_receiving(self) -> None:
        """The main thread has work: this thread takes the socket back lazily, at
        its next timer, unless the main thread comes back first."""
        self.main_receiving = False

    def watch(self) -> None:
        """The main thread is about to wait for work another way (a nested call's
        reply, the actors' event loop): this thread watches the socket now.

        A no-op on other threads (a ``breakpoint()`` in a user's thread): who
        receives follows what the main thread does. The first request of a busy
        period pokes this thread even if it already polls the socket: the main
        thread's drain may have taken the fd's notice of what is still queued.
        """
        if threading.get_ident() != self._main_ident:
            return
        self.main_receiving = False
        first = not self._watch_requested
        self._watch_requested = True
        if first or self._parked:  # _parked read after the request is visible: see _loop
            os.eventfd_write(self._wake_fd, 1)

    # -- the wire thread --------------------------------------------------------------

    def _run(self) -> None:
        self._thread_ident = threading.get_ident()
        try:
            self._loop()
        except BaseException:
            # Without its wire thread a rank is deaf: a crash here ends the process,
            # which the controller sees at once (pidfd), rather than a silent zombie.
            if not self._stopping:
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(71)

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._wake_fd, select.POLLIN)
        watching, seen_epoch, looked = False, -1, True
        next_heartbeat = time.monotonic() + self._heartbeat_s
        next_watch = time.monotonic() + _WATCH_INTERVAL_S
        while not self._stopping:
            self._parked = True  # before reading the main thread's state: see watch()
            watching = self._should_watch(watching, looked, seen_epoch)
            seen_epoch = self._receive_epoch
            if watching:
                self._parked = False
            self._watch_socket(poller, watching)
            now = time.monotonic()
            timeout = max(0.0, min(next_heartbeat, next_watch) - now)
            ready = poller.poll(int(timeout * 1000) + 1)
            # A timer or a poke (a send that saw input pending, watch(), stop()):
            # look at the socket, whoever owned it.
            looked = not ready
            for fd, _ in ready:
                if fd == self._wake_fd:
                    looked = True
                    clear_eventfd(self._wake_fd)
            self._parked = False
            try:
                while self._control_backlog and not self.status_held:
                    self._control(self._control_backlog.popleft())
                if not self.main_receiving and (watching or looked):
                    self.drain()
            except zmq.ZMQError:
                if self._stopping:
                    return  # the socket closed under us at shutdown
                raise
            except Exception:  # a bug here must not leave the rank deaf: say it, go on
                traceback.print_exc()
            now = time.monotonic()
            if now >= next_watch:
                next_watch = now + _WATCH_INTERVAL_S
                if os.getppid() != self._controller_pid:
                    os._exit(70)  # our controller is gone: so are we, busy or not
            if now >= next_heartbeat:
                next_heartbeat = now + self._heartbeat_s
                self._heartbeat()

    def _should_watch(self, watching: bool, looked: bool, seen_epoch: int) -> bool:
        """Whether this thread polls the socket until its next wake-up.

        Not while the main thread waits on it (two threads woken by every message
        would fight over it), nor once the main thread came back to it since the
        last look: it takes the next message itself. Otherwise (the main thread
        is busy) keep watching, or begin at a timer or a poke: a message that
        comes while user code runs waits at most until the next timer.
        """
        if self._watch_requested:
            return True
        if self.main_receiving or self._receive_epoch != seen_epoch:
            return False
        return watching or looked

    def _watch_socket(self, poller: select.poll, watch: bool) -> None:
        try:
            if watch:
                poller.register(self.socket_fd, select.POLLIN)  # again: a no-op
            else:
                poller.unregister(self.socket_fd)
        except KeyError:
            pass  # was not registered

    def drain(
        self,
        *,
        at_most: int | None = None,
        wait: bool = True,
        deliver: Callable[[Message, list[Any]], None] | None = None,
    ) -> bool | None:
        """Receive and hand on the messages waiting (this thread, or the idle main
        thread), or ``at_most`` of them; True if it stopped there, so more may
        wait with no notice left on the (edge-triggered) fd. ``wait=False``:
        None at once if the other thread drains now (it drains to the end and
        each delivery wakes the idle main thread). ``deliver``: how work is
        handed on this time (the idle main thread keeps the first for itself)."""
        if not self._drain_lock.acquire(blocking=wait):
            return None
        try:
            return self._drain(at_most, deliver or self._deliver)
        finally:
            self._drain_lock.release()

    def _drain(self, at_most: int | None, deliver: Callable[[Message, list[Any]], None]) -> bool:
        on_main = threading.get_ident() != self._thread_ident
        taken = self._taken
        more = True
        while True:
            if not taken:
                if not more:
                    return False
                if at_most is not None and at_most <= 0:
                    return True
                # A batch at a time: the receive that ends it costs no system
                # call, where asking the socket again for each message did. What
                # is taken waits in self._taken: a message whose handling raises
                # (the drain's callers say it and go on) leaves the rest for the
                # next drain.
                with self.lock:
                    batch, more = self._receiver.take(messages=at_most or _DRAIN_BATCH)
                if at_most is not None:
                    at_most -= len(batch)
                taken.extend(batch)
                continue
            frames = taken.popleft()
            try:
                message = self.signer.verify(frames, self._window, sender=CONTROLLER)
            except UnknownMessage as exc:
                self.send(ProtocolError(f"rank could not read a message: {exc}"))
                continue
            if message is None:
                continue
            if message.__class__ is Call:  # most messages: work, no control to look for
                deliver(message, frames)
            elif isinstance(message, StatusQuery) and on_main:
                # Answered now, it would describe the main thread draining, and
                # a call it just took would not have started yet. The wire
                # thread answers once the main thread is in its work, or idle.
                self.status_held = True
                self._control_backlog.append(message)
            elif isinstance(message, Interrupt | StatusQuery) or (
                type(message) in self.control_handlers
            ):
                # In order with the work around it (an interrupt of whatever
                # runs applies to what runs now, whichever thread receives it).
                self._control(message)
            else:
                deliver(message, frames)

    def release_status(self) -> None:
        """Main thread: it is in its work now (user code), done with it, or idle, so
        the status queries it received describe what it does: answer them."""
        if self.status_held:
            self.status_held = False
            os.eventfd_write(self._wake_fd, 1)

    def _control(self, message: Message) -> None:
        match message:
            case Interrupt(call_id):
                self._interrupt(call_id)
            case StatusQuery(query_id):
                work, seconds = self._busy()
                stack = self._main_stack() + self.describe_awaiting()
                self.send(StatusReply(query_id, work, seconds, stack, _collectives()))
            case _:
                self.control_handlers[type(message)](message)

    def interrupt_main(self) -> None:
        # A real signal, not _thread.interrupt_main(): it also breaks a sleep or
        # a blocking read. The main thread's handler raises only in user code.
        if self._main_ident is not None:
            signal.pthread_kill(self._main_ident, signal.SIGINT)

    def _main_stack(self) -> str:
        frame = self._main_frame()
        # The main thread has work (a label) but is still in the worker's own frames
        # on its way into it (it released a status query it had received together
        # with the call): give it a moment, so the stack shows the work.
        deadline = time.monotonic() + _INTO_WORK_S
        while (
            frame is not None
            and frame.f_code.co_filename in _DISPATCH_FILES
            and self._busy()[0]
            and time.monotonic() < deadline
        ):
            time.sleep(0.001)
            frame = self._main_frame()
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def _main_frame(self) -> Any:
        return sys._current_frames().get(self._main_ident or 0)

    def _heartbeat(self) -> None:
        sample, metrics = _resources.sample(), _metrics.drain()

        def encode() -> Any:
            # What the main thread runs, read under the send lock: read before, a
            # call could end and its reply leave first, and this heartbeat, saying
            # the call still runs, would make the controller think the rank busy
            # after its reply (till the next heartbeat). Seen as a `%mesh start`
            # status that showed a rank busy in its finished dist setup.
            work, seconds = self._busy()
            return self.signer.encode(Heartbeat(sample, work, seconds, metrics), by_value=False)

        try:
            self.send_encoded(encode)
        except zmq.ZMQError:
            pass  # the socket is closing: we are shutting down


def _collectives() -> int:
    """How many collectives the default torch.distributed group has issued (a rank
    waiting in one has counted it), or -1; never imports torch itself."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return -1
        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # a backend without sequence numbers, a torch without the API
        return -1
