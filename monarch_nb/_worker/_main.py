"""The worker process: runs actors and cells on its main thread, one message at a time.

Started as ``python -m monarch_nb.worker`` with its bootstrap (address,
identity, signing key, rank) as one JSON line on stdin. The wire thread
(:mod:`._wire_thread`) receives every message and hands work here through a
queue, so calls to an actor run in the order they were sent; replies go out
from this thread directly.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import zmq

from .._common import _context
from .._common._context import Context
from .._common._errors import MeshFailure, RemoteFailure
from .._common._messages import (
    BroadcastFailure,
    Call,
    Failure,
    Hello,
    Message,
    ProtocolError,
    Pull,
    Push,
    RunCell,
    Shutdown,
    Spawn,
    StopActor,
    Supervision,
    Value,
)
from .._common._shape import Shape
from .._common._wire import Signer, WireStats, decode_payload
from ._wire_thread import WireThread

DEFAULT_HEARTBEAT_S = 1.0
# Frames of these files sit between the wire and user code: noise in a traceback.
_DISPATCH_FILES = frozenset(
    os.path.join(os.path.dirname(__file__), name) for name in ("_main.py", "_namespace.py")
)


class _LiveActor:
    __slots__ = ("context", "instance", "label")

    def __init__(self, instance: Any, context: Context) -> None:
        self.instance = instance
        self.context = context
        self.label = type(instance).__name__


def _call_id_of(message: Message) -> int:
    """The call a work message answers (0 for a broadcast or a non-call)."""
    match message:
        case Call(call_id, _, _, True) | Spawn(call_id) | RunCell(call_id) | Push(call_id):
            return call_id
        case Pull(call_id):
            return call_id
    return 0


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
        sock = self.zmq.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, boot["identity"].encode())
        sock.setsockopt(zmq.LINGER, 2000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(boot["address"])
        self.socket = sock
        self.signer = Signer(bytes.fromhex(boot["key"]), WireStats())
        # (message, frames, its call id) from the wire thread, or a posted task.
        self._inbox: queue.SimpleQueue[tuple[Message, list[Any], int] | Callable[[], None]] = (
            queue.SimpleQueue()
        )
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
        self.actors: dict[int, _LiveActor] = {}
        self._loop: Any = None  # an asyncio loop, made for the first async endpoint
        self.namespace: Any = None  # a _namespace.RankNamespace once a cell runs
        self._in_user_code = False
        # What the main thread runs now and since when, for heartbeats and status:
        # one tuple, so the wire thread never reads a label with another's start.
        self._work: tuple[str, float] = ("", 0.0)
        # Which calls are queued, which runs, which to skip: interrupts target
        # one call (wire thread) while the main thread moves through the queue.
        self._calls_lock = threading.Lock()
        self._queued: set[int] = set()
        self._running = 0
        self._interrupted = 0  # the running call, once an interrupt for it arrived
        self._skip: set[int] = set()
        signal.signal(signal.SIGINT, self._on_sigint)
        _context.set_supervision_hook(self._on_child_failure)

    # -- what the main thread is doing (read by the wire thread) ----------------------

    def busy(self) -> tuple[str, float]:
        label, since = self._work
        return (label, time.monotonic() - since) if label else ("", 0.0)

    # -- interrupts of one call (wire thread) -----------------------------------------

    def _deliver(self, message: Message, frames: list[Any]) -> None:
        call_id = _call_id_of(message)
        if call_id:
            with self._calls_lock:
                self._queued.add(call_id)
        self._inbox.put((message, frames, call_id))

    def interrupt(self, call_id: int) -> None:
        """Stop ``call_id`` (0: whatever runs): signal it if it runs; if it is still
        queued, answer it as interrupted now and skip it when its turn comes."""
        with self._calls_lock:
            if call_id and call_id in self._queued:
                self._queued.discard(call_id)
                self._skip.add(call_id)
                queued = True
            elif call_id == 0 or call_id == self._running:
                self._interrupted = self._running
                queued = False
            else:
                return  # already answered: nothing to stop
        if queued:
            failure = RemoteFailure(
                self.rank, "KeyboardInterrupt", "interrupted before it started on this rank", ""
            )
            self.send(Failure(call_id, failure, False))
        else:
            self.wire.interrupt_main()

    def _start(self, call_id: int) -> bool:
        """Main thread: ``call_id`` reaches the front; False if it was skipped."""
        if not call_id:
            return True
        with self._calls_lock:
            self._queued.discard(call_id)
            if call_id in self._skip:
                self._skip.discard(call_id)
                return False
            self._running = call_id
            self._interrupted = 0
        return True

    def _finish(self) -> None:
        with self._calls_lock:
            self._running = self._interrupted = 0

    def reply_value(self, call_id: int, value: Any) -> None:
        try:
            message = self.signer.encode(Value(call_id), value, by_value=False)
        except Exception as exc:
            failure = RemoteFailure(
                self.rank,
                type(value).__name__,
                f"the return value ({type(value).__name__}) cannot be pickled: {exc}",
                "",
            )
            self.send(Failure(call_id, failure, True))
            return
        self.wire.send_encoded(message)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # An interrupt is meant for user code. Raised anywhere else (between
        # calls, or while a reply is being sent) it would lose a reply.
        if self._in_user_code:
            raise KeyboardInterrupt

    def user_code(self, label: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` with interrupts enabled (main thread), labelled for status."""
        self._work = (label, time.monotonic())
        self._in_user_code = True
        try:
            if self._interrupted and self._interrupted == self._running:
                raise KeyboardInterrupt  # it came while the arguments were unpickled
            return fn()
        finally:
            self._in_user_code = False
            self._work = ("", 0.0)

    def post(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the main thread between messages (any thread may call)."""
        self._inbox.put(task)

    # -- the loop -------------------------------------------------------------------

    def run(self) -> None:
        self.wire.start()
        self.send(Hello(os.getpid(), socket.gethostname()))
        inbox = self._inbox
        while True:
            item = inbox.get()
            if callable(item):
                item()
            elif not self.handle(*item):
                return

    def handle(self, message: Message, frames: list[Any], call_id: int) -> bool:
        """Handle one work message; False means shut down."""
        if not self._start(call_id):
            return True  # interrupted while queued: already answered
        try:
            return self._handle(message, frames)
        finally:
            self._finish()

    def _handle(self, message: Message, frames: list[Any]) -> bool:
        match message:
            case Call():
                self.on_call(message, frames)
            case Spawn():
                self.on_spawn(message, frames)
            case RunCell() | Push() | Pull():
                self.on_cell(message, frames)
            case StopActor(actor_id):
                self.actors.pop(actor_id, None)
            case Shutdown():
                return False
            case _:
                self.send(ProtocolError(f"a worker does not handle {type(message).__name__}"))
        return True

    def _decode_or_fail(
        self, call_id: int, reply: bool, label: str, frames: list[Any], actor_id: int = 0
    ) -> Any:
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
            self._report(call_id, reply, actor_id, label, failure, serialization=True)
            return _FAILED

    def on_spawn(self, message: Spawn, frames: list[Any]) -> None:
        call_id, name = message.call_id, message.name
        decoded = self._decode_or_fail(call_id, True, f"spawn of {name!r}", frames)
        if decoded is _FAILED:
            return
        cls, args, kwargs = decoded
        shape = Shape(message.labels, message.sizes, message.ranks)
        ctx = Context(shape.point_of_rank(self.rank), len(shape), self.mesh_name, name)
        previous = _context.set_current(ctx)
        try:
            instance = self.user_code(f"spawn {name!r}", lambda: _construct(cls, args, kwargs))
        except BaseException as exc:
            self.send(Failure(call_id, self.failure_of(exc), False))
            return
        finally:
            _context.set_current(previous)
        self.actors[message.actor_id] = _LiveActor(
            instance, dataclasses.replace(ctx, actor=instance)
        )
        self.send(Value(call_id))

    def on_call(self, message: Call, frames: list[Any]) -> None:
        call_id, actor_id, endpoint, reply = (
            message.call_id,
            message.actor_id,
            message.endpoint,
            message.reply,
        )
        live = self.actors.get(actor_id)
        label = f"{live.label if live else 'actor'}.{endpoint}"
        decoded = self._decode_or_fail(call_id, reply, label, frames, actor_id)
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
            result = self.user_code(label, lambda: self._call_maybe_async(method, args, kwargs))
        except BaseException as exc:
            self._report(call_id, reply, actor_id, label, self.failure_of(exc))
            return
        finally:
            _context.set_current(previous)
        if reply:
            self.reply_value(call_id, result)

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
            self.send(Failure(call_id, failure, serialization))
        else:  # a broadcast has no caller: supervision takes it
            self.send(BroadcastFailure(actor_id, label, failure))

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
                    result = self.user_code(
                        f"cell {filename}",
                        lambda: self._call_maybe_async(ns.execute, (filename, decoded), {}),
                    )
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

    def _call_maybe_async(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        result = fn(*args, **kwargs)
        if result is not None and inspect.isawaitable(result):
            result = self.run_async(result)
        return result

    def run_async(self, awaitable: Any) -> Any:
        import asyncio

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        task = asyncio.ensure_future(awaitable, loop=self._loop)
        try:
            return self._loop.run_until_complete(task)
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
        text = "".join(traceback.format_exception(type(exc), exc, tb))
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
        try:
            handled = self.user_code(
                label, lambda: self._call_maybe_async(owner.__supervise__, (error,), {})
            )
            why = f"its __supervise__ returned {handled!r}"
        except BaseException as exc:
            handled = False
            why = f"its __supervise__ raised {type(exc).__name__}: {exc}"
        finally:
            _context.set_current(previous)
        if not handled:
            self.send(Supervision(f"{type(owner).__name__} did not handle ({why}): {error}"))


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


def main() -> None:
    # Interrupts are how calls stop: whatever mask or disposition the process
    # that launched us had (a blocked or ignored SIGINT is inherited), take
    # SIGINT back for the main thread.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    boot = json.loads(sys.stdin.buffer.readline())
    _die_with_parent(boot["controller_pid"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # user code calling input() gets EOF, not our bootstrap pipe
    os.close(devnull)
    worker = Worker(boot)
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
        sys.stdout.flush()
        sys.stderr.flush()
        worker.wire.stop()
        with worker.wire.lock:
            worker.socket.close()
        os._exit(code)
