"""The worker's wire thread: it owns receiving, so the wire flows while user code runs.

Threads of a worker, and what each owns::

    main thread    runs work (spawns, calls, cells, push/pull) one message at a
                   time, in the order sent, and sends their replies itself
    wire thread    receives and verifies every message; answers control
                   messages (Interrupt, StatusQuery) at once, even while the
                   main thread is busy in user code or stopped in pdb; sends
                   heartbeats with a resource sample; exits the process when
                   the controller is gone

Both send. The socket is used under ``lock`` only (zmq lets a socket move
between threads behind a full memory barrier, which a lock is). Its
``ZMQ_FD`` is edge-triggered, and a send can consume the notification of a
message that just arrived, so a sender that sees input pending wakes the wire
thread through its eventfd.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import zmq

from .._common import _metrics
from .._common._messages import (
    Heartbeat,
    Interrupt,
    Message,
    ProtocolError,
    StatusQuery,
    StatusReply,
    UnknownMessage,
)
from .._common._wire import CONTROLLER, ReplayWindow, Signer, receive
from . import _resources

_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_WATCH_INTERVAL_S = 0.2  # how often the controller's liveness is checked


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
        self.signer = signer
        self.lock = threading.Lock()
        self._deliver = deliver  # hands work to the main thread
        self._busy = busy  # (what the main thread runs, since when), "" when idle
        self._interrupt = interrupt  # stop one call (or whatever runs): the worker decides
        self._controller_pid = controller_pid
        self._heartbeat_s = heartbeat_s
        self._window = ReplayWindow()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._main_ident = threading.main_thread().ident
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="monarch_nb-wire", daemon=True)
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
        with self.lock:
            encoded.send(self.socket)
            pending = int(self.socket.getsockopt(_EVENTS)) & _POLLIN
        if pending and threading.current_thread() is not self._thread:
            os.eventfd_write(self._wake_fd, 1)

    # -- the wire thread --------------------------------------------------------------

    def _run(self) -> None:
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
        poller = zmq.Poller()
        poller.register(self.socket.getsockopt(zmq.FD), zmq.POLLIN)
        poller.register(self._wake_fd, zmq.POLLIN)
        next_heartbeat = time.monotonic() + self._heartbeat_s
        next_watch = time.monotonic() + _WATCH_INTERVAL_S
        while not self._stopping:
            now = time.monotonic()
            timeout = max(0.0, min(next_heartbeat, next_watch) - now)
            for item, _ in poller.poll(int(timeout * 1000)):
                if item == self._wake_fd:
                    try:
                        os.eventfd_read(self._wake_fd)
                    except BlockingIOError:
                        pass
            try:
                self._drain()
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

    def _drain(self) -> None:
        while True:
            with self.lock:
                frames = receive(self.socket, self.signer.stats)
            if frames is None:
                return
            try:
                message = self.signer.verify(frames, self._window, sender=CONTROLLER)
            except UnknownMessage as exc:
                self.send(ProtocolError(f"rank could not read a message: {exc}"))
                continue
            if message is None:
                continue
            match message:
                case Interrupt(call_id):
                    self._interrupt(call_id)
                case StatusQuery(query_id):
                    work, seconds = self._busy()
                    stack = self._main_stack()
                    self.send(StatusReply(query_id, work, seconds, stack, _collectives()))
                case _:
                    handler = self.control_handlers.get(type(message))
                    if handler is not None:
                        handler(message)
                    else:
                        self._deliver(message, frames)

    def interrupt_main(self) -> None:
        # A real signal, not _thread.interrupt_main(): it also breaks a sleep or
        # a blocking read. The main thread's handler raises only in user code.
        if self._main_ident is not None:
            signal.pthread_kill(self._main_ident, signal.SIGINT)

    def _main_stack(self) -> str:
        frame = sys._current_frames().get(self._main_ident or 0)
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def _heartbeat(self) -> None:
        work, seconds = self._busy()
        try:
            self.send(Heartbeat(_resources.sample(), work, seconds, _metrics.drain()))
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
