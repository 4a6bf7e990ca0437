"""``this_proc()``: actors in the caller's own process.

In an actor, ``this_proc()`` is the rank's own process: actors spawned there
run in the same worker, beside the caller. On the controller (a script, a
notebook kernel) it is the controller's process: its actors run on one thread
of their own (``monarch_nb-actors``), in an event loop, and are reached through
the controller's peer node like any other actor, so references to them travel
and other actors call them directly. As on a worker, messages start in the order
sent, a sync endpoint runs to its end before the next message, and the calls of
``async def`` endpoints are tasks that interleave at their awaits.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import traceback
from collections.abc import Coroutine
from typing import Any

from .._model._errors import MeshUsageError, RemoteFailure, never_constructed
from .._model._shape import Point, Shape
from .._wire._messages import Call, Failure, Message, Spawn, StopActor, Value
from .._wire._signed import decode_payload
from . import _context, _peer, _refs
from ._actors import wants_response_port
from ._peer import PeerRoute

_host: LocalActorHost | None = None
_host_lock = threading.Lock()


def this_proc() -> Any:
    """The caller's own process as a one-process mesh: ``this_proc().spawn(...)``."""
    from ._peer_mesh import PeerProcMesh

    node = _peer.node_or_none()
    if node is not None and node.home is not None:  # in a worker: the rank's own process
        procs, rank = node.home
        return PeerProcMesh(procs, Shape([], [], [rank]))
    with _host_lock:
        global _host
        if _host is None:
            _host = LocalActorHost(_peer.local_node())
        host = _host
    return PeerProcMesh(host.ref, Shape([], [], [0]))


class LocalActorHost:
    """Runs the actors spawned on the controller's own process (see the module doc)."""

    def __init__(self, node: _peer.PeerNode) -> None:
        prefix = node.address[: -len("0")]
        self.ref = _refs.ProcsRef(
            "local-" + node.identity.hex()[:12],
            0,
            "this_proc",
            socket.gethostname(),
            prefix,
            _refs.ViewRef.of(Shape([], [], [0])),
        )
        self.actors: dict[int, tuple[Any, _context.Context]] = {}
        # Actors whose __init__ raised: their calls answer that failure.
        self._failed_inits: dict[int, RemoteFailure] = {}
        self._tasks: dict[int, set[asyncio.Task[None]]] = {}  # async calls, by actor
        self._loop = asyncio.new_event_loop()
        self._inbox: asyncio.Queue[tuple[Message, list[Any], PeerRoute]] = asyncio.Queue()
        node.on_work = self._receive
        threading.Thread(target=self._run, name="monarch_nb-actors", daemon=True).start()

    def _receive(self, message: Message, frames: list[Any], route: PeerRoute) -> None:
        """The peer node's thread: a message for our actors, in order."""
        self._loop.call_soon_threadsafe(self._inbox.put_nowait, (message, frames, route))

    def _run(self) -> None:
        self._loop.run_until_complete(self._dispatch())

    async def _dispatch(self) -> None:
        while True:
            message, frames, route = await self._inbox.get()
            try:
                rest = self._handle(message, frames, route)
                if rest is not None:  # what must happen before the next message
                    await rest
            except Exception:
                traceback.print_exc()  # a bug here must not stop the other actors

    def _handle(
        self, message: Message, frames: list[Any], route: PeerRoute
    ) -> Coroutine[Any, Any, None] | None:
        """Handle one message; what is left of it to await before the next, if
        anything: an async call's first step, an actor's stop."""
        match message:
            case Spawn(call_id, actor_id, name, labels, sizes, ranks):
                shape = Shape(labels, sizes, ranks)
                ctx = _context.Context(
                    Point({}, 0),
                    1,
                    "this_proc",
                    name,
                    actor_id=actor_id,
                    procs=self.ref,
                    shape=shape,
                )
                _context.set_task_context(ctx)
                try:
                    # (A spawner's supervision port may follow: this process's
                    # broadcast failures are printed here, below.)
                    cls, args, kwargs, *_ = decode_payload(frames)
                    instance = cls(*args, **kwargs)
                except BaseException as exc:
                    self._failed_inits[actor_id] = _failure(exc)
                    route.send(Failure(call_id, self._failed_inits[actor_id], False))
                    return None
                self.actors[actor_id] = (
                    instance,
                    _context.Context(
                        ctx.point, 1, "this_proc", name, instance, actor_id, self.ref, shape
                    ),
                )
                route.send(Value(call_id))
            case Call(call_id, actor_id, endpoint, reply):
                entry = self.actors.get(actor_id)
                port = None
                if entry is None and actor_id in self._failed_inits:
                    if reply:
                        failure = never_constructed(self._failed_inits[actor_id])
                        route.send(Failure(call_id, failure, False))
                    return None
                try:
                    if entry is None:
                        raise LookupError(f"no actor {actor_id} in this process: it was stopped")
                    instance, ctx = entry
                    _context.set_task_context(ctx)
                    args, kwargs = decode_payload(frames)
                    method = getattr(instance, endpoint)
                    if wants_response_port(method):  # it answers through the port
                        port = _ResponsePort(route, call_id if reply else 0)
                        args = (port, *args)
                        reply = False
                    result = method(*args, **kwargs)
                except BaseException as exc:
                    _answer_failure(route, call_id, reply, exc, port)
                    return None
                if inspect.isawaitable(result):
                    answer = _answer(result, ctx, route, call_id, reply, port)
                    task = self._loop.create_task(answer)
                    tasks = self._tasks.setdefault(actor_id, set())
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    return asyncio.sleep(0)  # its first step (ready tasks run in order)
                if reply:
                    route.send(Value(call_id), result)
            case StopActor(actor_id, call_id):
                entry = self.actors.pop(actor_id, None)
                tasks = self._tasks.pop(actor_id, set())
                for task in tasks:
                    task.cancel()
                if entry is not None:
                    return _stop(entry[0], entry[1], tasks, route, call_id)
                if call_id:
                    route.send(Value(call_id))
        return None


async def _stop(
    instance: Any,
    ctx: _context.Context,
    tasks: set[asyncio.Task[None]],
    route: PeerRoute,
    call_id: int,
) -> None:
    """A stopped actor: its cancelled calls unwind (their handlers run, their
    callers are answered), then its ``__cleanup__(None)`` runs, then the stop's
    caller (``call_id``, if any) is answered."""
    if tasks:
        await asyncio.wait(tasks)
    cleanup = getattr(instance, "__cleanup__", None)
    if cleanup is not None:
        _context.set_task_context(ctx)
        try:
            result = cleanup(None)
            if inspect.isawaitable(result):
                await result
        except Exception:
            traceback.print_exc()  # the stop's future is no error report: say it here
    if call_id:
        route.send(Value(call_id))


async def _answer(
    awaitable: Any,
    ctx: _context.Context,
    route: PeerRoute,
    call_id: int,
    reply: bool,
    port: _ResponsePort | None,
) -> None:
    """Await an async call's body (a task of its own) and answer its caller."""
    _context.set_task_context(ctx)
    try:
        result = await awaitable
    except BaseException as exc:
        _answer_failure(route, call_id, reply, exc, port)
        return
    if reply:
        route.send(Value(call_id), result)


class _ResponsePort:
    """What an ``explicit_response_port`` endpoint answers through: its call's
    reply (the first answer counts; any thread)."""

    def __init__(self, route: PeerRoute, call_id: int) -> None:
        self._route = route
        self._call_id = call_id  # 0 for a broadcast: nobody waits for an answer
        self._sent = False
        self._lock = threading.Lock()

    @property
    def answers_a_caller(self) -> bool:
        return self._call_id != 0

    def _first(self) -> bool:
        with self._lock:
            first, self._sent = not self._sent and self._call_id != 0, True
        return first

    def send(self, value: Any) -> None:
        """Answer the call with ``value``."""
        if self._first():
            self._route.send(Value(self._call_id), value)

    def exception(self, exc: BaseException) -> None:
        """Answer the call with an error, as if the endpoint had raised ``exc``."""
        if self._first():
            self._route.send(Failure(self._call_id, _failure(exc), False))

    def __reduce__(self):
        raise MeshUsageError(
            "an endpoint's response port answers its caller from this process; "
            "to answer elsewhere, pass a Port from Channel.open() instead"
        )


def _answer_failure(
    route: PeerRoute,
    call_id: int,
    reply: bool,
    exc: BaseException,
    port: _ResponsePort | None = None,
) -> None:
    if port is not None and port.answers_a_caller:
        port.exception(exc)  # its caller waits on the port (unless it answered already)
    elif reply:
        route.send(Failure(call_id, _failure(exc), False))
    else:
        traceback.print_exc()  # a broadcast: nobody waits, say it here


def _failure(exc: BaseException) -> RemoteFailure:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        message = str(exc)
    except Exception as broken:
        message = f"<str() of the exception failed: {type(broken).__name__}>"
    return RemoteFailure(0, type(exc).__name__, message, text)
