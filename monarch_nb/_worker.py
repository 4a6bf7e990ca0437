"""The worker process: runs actors on its main thread, answers the controller.

Started as ``python -m monarch_nb.worker`` with its bootstrap (address,
identity, signing key, rank) as one JSON line on stdin. The main thread owns
the DEALER socket and handles one message at a time, so calls to an actor run
in the order they were sent and a reply goes out without a thread hop. A
daemon thread watches the controller: if it goes away the worker exits at
once, even while user code is busy, so no worker outlives its controller.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from . import _context
from ._context import Context
from ._errors import MeshFailure, RemoteFailure
from ._shape import Shape
from ._wire import Signer, WireStats, decode_payload, receive

_WATCH_INTERVAL_S = 0.2
# Frames of these files sit between the wire and user code: noise in a traceback.
_DISPATCH_FILES = frozenset(
    os.path.join(os.path.dirname(__file__), name) for name in ("_worker.py", "_cells.py")
)


class _LiveActor:
    __slots__ = ("context", "instance", "label")

    def __init__(self, instance: Any, context: Context) -> None:
        self.instance = instance
        self.context = context
        self.label = type(instance).__name__


class Worker:
    """One worker's message loop (main thread)."""

    def __init__(self, boot: dict[str, Any]) -> None:
        self.rank: int = boot["rank"]
        labels, sizes = boot["shape"]
        self.shape = Shape.from_sizes(dict(zip(labels, sizes, strict=False)))
        self.mesh_name: str = boot["mesh"]
        self.signer = Signer(bytes.fromhex(boot["key"]), WireStats())
        self.last_sequence = 0
        self.zmq = zmq.Context()
        self.socket = self.zmq.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, boot["identity"].encode())
        self.socket.setsockopt(zmq.LINGER, 2000)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.connect(boot["address"])
        self.actors: dict[int, _LiveActor] = {}
        self._posted: deque[Callable[[], None]] = deque()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._loop: Any = None  # an asyncio loop, made for the first async endpoint
        self.namespace: Any = None  # a _cells.RankNamespace once a cell runs
        self._in_user_code = False
        signal.signal(signal.SIGINT, self._on_sigint)
        _context.set_supervision_hook(self._on_child_failure)

    # -- sending ------------------------------------------------------------------

    def send(self, meta: tuple, payload: Any = None) -> None:
        message = self.signer.encode(meta, payload, by_value=False)
        message.send(self.socket)

    def reply_value(self, call_id: int, label: str, value: Any) -> None:
        try:
            message = self.signer.encode(("value", call_id), value, by_value=False)
        except Exception as exc:
            failure = RemoteFailure(
                self.rank,
                type(value).__name__,
                f"the return value ({type(value).__name__}) cannot be pickled: {exc}",
                "",
            )
            self.send(("failure", call_id, failure, True))
            return
        message.send(self.socket)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # An interrupt is meant for user code. Raised anywhere else (between
        # calls, or while a reply is being sent) it would lose a reply.
        if self._in_user_code:
            raise KeyboardInterrupt

    def user_code(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` with interrupts enabled (main thread)."""
        self._in_user_code = True
        try:
            return fn()
        finally:
            self._in_user_code = False

    def post(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the main thread between messages (any thread may call)."""
        self._posted.append(task)
        os.eventfd_write(self._wake_fd, 1)

    # -- the loop -------------------------------------------------------------------

    def run(self) -> None:
        self.send(("hello", os.getpid()))
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._wake_fd, zmq.POLLIN)
        wake_fd = self._wake_fd
        while True:
            for item, _ in poller.poll():
                if item == wake_fd:
                    os.eventfd_read(wake_fd)
            while self._posted:
                self._posted.popleft()()
            while (frames := receive(self.socket)) is not None:
                if not self.handle(frames):
                    return

    def handle(self, frames: list[Any]) -> bool:
        """Handle one message; False means shut down."""
        checked = self.signer.verify(frames, self.last_sequence)
        if checked is None:
            return True
        self.last_sequence, meta = checked
        kind = meta[0]
        if kind == "call":
            self.on_call(meta, frames)
        elif kind == "spawn":
            self.on_spawn(meta, frames)
        elif kind in ("exec", "push", "pull"):
            self.on_cell(meta, frames)
        elif kind == "stop_actor":
            self.actors.pop(meta[1], None)
        elif kind == "shutdown":
            return False
        return True

    def _decode_or_fail(self, call_id: int, reply: bool, label: str, frames: list[Any]) -> Any:
        try:
            return decode_payload(frames)
        except Exception as exc:
            failure = RemoteFailure(
                self.rank,
                type(exc).__name__,
                f"the arguments could not be unpickled: {type(exc).__name__}: {exc} "
                "(is the module that defines them importable on the workers?)",
                "",
            )
            self._report(call_id, reply, 0, label, failure, serialization=True)
            return _FAILED

    def on_spawn(self, meta: tuple, frames: list[Any]) -> None:
        _, call_id, actor_id, name, labels, sizes, ranks = meta
        decoded = self._decode_or_fail(call_id, True, f"spawn of {name!r}", frames)
        if decoded is _FAILED:
            return
        cls, args, kwargs = decoded
        shape = Shape(labels, sizes, ranks)
        ctx = Context(shape.point_of_rank(self.rank), len(shape), self.mesh_name, name)
        previous = _context.set_current(ctx)
        try:
            instance = self.user_code(lambda: cls(*args, **kwargs))
        except BaseException as exc:
            self.send(("failure", call_id, self.failure_of(exc), False))
            return
        finally:
            _context.set_current(previous)
        self.actors[actor_id] = _LiveActor(instance, dataclasses.replace(ctx, actor=instance))
        self.send(("value", call_id))

    def on_call(self, meta: tuple, frames: list[Any]) -> None:
        _, call_id, actor_id, endpoint, reply = meta
        live = self.actors.get(actor_id)
        label = f"{live.label if live else 'actor'}.{endpoint}"
        decoded = self._decode_or_fail(call_id, reply, label, frames)
        if decoded is _FAILED:
            return
        if live is None:
            error = LookupError(f"no actor {actor_id} on rank {self.rank}: it was stopped")
            self._report(call_id, reply, actor_id, label, self.failure_of(error))
            return
        args, kwargs = decoded
        previous = _context.set_current(live.context)
        try:
            method = getattr(live.instance, endpoint)
            result = self.user_code(lambda: self._call_maybe_async(method, args, kwargs))
        except BaseException as exc:
            self._report(call_id, reply, actor_id, label, self.failure_of(exc))
            return
        finally:
            _context.set_current(previous)
        if reply:
            self.reply_value(call_id, label, result)

    def _report(
        self,
        call_id: int,
        reply: bool,
        actor_id: int,
        label: str,
        failure: RemoteFailure,
        *,
        serialization: bool = False,
    ) -> None:
        if reply:
            self.send(("failure", call_id, failure, serialization))
        else:  # a broadcast has no caller: supervision takes it
            self.send(("broadcast_failure", actor_id, label, failure))

    def on_cell(self, meta: tuple, frames: list[Any]) -> None:
        kind, call_id = meta[0], meta[1]
        label = f"{kind} {meta[2]}" if len(meta) > 2 else kind
        decoded = self._decode_or_fail(call_id, True, label, frames)
        if decoded is _FAILED:
            return
        if self.namespace is None:
            from ._cells import RankNamespace

            self.namespace = RankNamespace(self)
        ns = self.namespace
        previous = _context.set_current(ns.context)
        try:
            if kind == "exec":
                result = self.user_code(
                    lambda: self._call_maybe_async(ns.execute, (meta[2], decoded), {})
                )
            elif kind == "push":
                ns.globals.update(decoded)
                result = None
            else:
                result = ns.pull(meta[2])
        except BaseException as exc:
            self.send(("failure", call_id, self.failure_of(exc), False))
            return
        finally:
            _context.set_current(previous)
        self.reply_value(call_id, label, result)

    def send_event(self, kind: str, detail: Any) -> None:
        """Tell the controller's listeners something (rich display, progress)."""
        self.send(("event", kind), detail)

    def _call_maybe_async(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        result = fn(*args, **kwargs)
        if result is not None and inspect.isawaitable(result):
            result = self.run_async(result)
        return result

    def run_async(self, awaitable: Any) -> Any:
        if self._loop is None:
            import asyncio

            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(awaitable)

    def failure_of(self, exc: BaseException) -> RemoteFailure:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _DISPATCH_FILES:
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        return RemoteFailure(self.rank, type(exc).__name__, str(exc), text)

    # -- supervision of meshes our actors started -------------------------------------

    def _on_child_failure(self, owner: Any, error: MeshFailure) -> None:
        self.post(lambda: self._supervise(owner, error))

    def _supervise(self, owner: Any, error: MeshFailure) -> None:
        try:
            handled = bool(owner.__supervise__(error))
            why = "its __supervise__ returned False"
        except BaseException as exc:
            handled = False
            why = f"its __supervise__ raised {type(exc).__name__}: {exc}"
        if not handled:
            self.send(("supervision", f"{type(owner).__name__} did not handle ({why}): {error}"))


_FAILED = object()


def _watch_controller(controller_pid: int) -> None:
    # The controller is our parent: if it dies we are re-parented, and go too.
    while True:
        if os.getppid() != controller_pid:
            os._exit(70)
        time.sleep(_WATCH_INTERVAL_S)


def main() -> None:
    boot = json.loads(sys.stdin.buffer.readline())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # user code calling input() gets EOF, not our bootstrap pipe
    os.close(devnull)
    threading.Thread(
        target=_watch_controller, args=(boot["controller_pid"],), name="watch", daemon=True
    ).start()
    worker = Worker(boot)
    try:
        worker.run()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        worker.socket.close()
        os._exit(0)
