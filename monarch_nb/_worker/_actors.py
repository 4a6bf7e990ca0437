"""The actors a worker process hosts, and their calls.

A spawn constructs one on the main thread; a call runs its endpoint there, one
at a time, in the order sent. A call of an ``async def`` endpoint becomes a
task on the actors' event loop (:mod:`._endpoint_tasks`), which runs between
messages: such calls interleave at their awaits. Stopping an actor cancels its
calls in flight, then runs its ``__cleanup__``; a mesh it started that fails
reaches its ``__supervise__``. An endpoint that raises a ``BaseException``
that is not an ``Exception`` ends its actor here, as in Monarch (see
:meth:`Actors._end_actor`).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from .._model._errors import MeshFailure, MeshUsageError, RemoteFailure, never_constructed
from .._model._shape import Shape
from .._runtime import _context, _owned, _refs
from .._runtime._actors import is_concurrent, wants_response_port
from .._runtime._context import Context
from .._runtime._peer_mesh import PeerActorMesh
from .._wire._messages import (
    AWAITING_HEADING,
    BroadcastFailure,
    Call,
    Failure,
    Spawn,
    Supervision,
    Value,
)
from .._wire._signed import decode_payload
from ._answers import Answers, Route
from ._endpoint_tasks import NO_TICKET, TaskCall, stepped, where_awaiting
from ._frames import not_user_code
from ._inbox import Inbox
from ._running import Running

# How long a stopped actor waits for each mesh it started to stop (their __cleanup__).
OWNED_STOP_WAIT_S = 60.0


class LiveActor:
    """An actor this process hosts: its instance, context and async calls in flight."""

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

    __slots__ = ("_answers", "_call_id", "_lock", "_route", "_sent")

    def __init__(self, answers: Answers, route: Route, call_id: int) -> None:
        self._answers = answers
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
            self._answers.reply_value(self._call_id, value, self._route)

    def exception(self, exc: BaseException) -> None:
        """Answer the call with an error, as if the endpoint had raised ``exc``."""
        if self._first():
            self._route.send(Failure(self._call_id, self._answers.failure_of(exc), False))

    def fail(self, failure: RemoteFailure) -> None:
        """Answer the call with ``failure``, unless it was answered already."""
        if self._first():
            self._route.send(Failure(self._call_id, failure, False))

    def __reduce__(self):
        raise MeshUsageError(
            "an endpoint's response port answers its caller from this process; "
            "to answer elsewhere, pass a Port from Channel.open() instead"
        )


class _Host(Protocol):
    """The worker, as its actors name it: where it sits in its mesh now (a
    resize changes it)."""

    rank: int
    mesh_name: str
    procs_ref: _refs.ProcsRef | None


class Actors:
    """The actors of this process by id, and how their spawns, calls and stops run."""

    def __init__(self, host: _Host, running: Running, inbox: Inbox, answers: Answers) -> None:
        self._host = host
        self._running = running
        self._inbox = inbox
        self._answers = answers
        self.live: dict[int, LiveActor] = {}
        # Actors whose spawn failed here (__init__ raised, or the class or its
        # arguments did not unpickle): a call to one answers what this holds
        # (spawning does not wait, so calls sent meanwhile queue behind the spawn).
        self._failed_inits: dict[int, RemoteFailure] = {}
        # Actors that failed here (see _end_actor): a call to one answers this
        # (``actor_failed``: its caller raises SupervisionError).
        self._failed_actors: dict[int, RemoteFailure] = {}
        # Bound once: each call uses them.
        self._active = running.active
        self._user_code = running.user_code
        self._report = answers.report
        self._failure_of = answers.failure_of
        self._reply_value = answers.reply_value
        self._send = answers.controller_route.send

    def on_spawn(self, message: Spawn, frames: list[Any], route: Route) -> None:
        call_id, name = message.call_id, message.name
        try:
            decoded = decode_payload(frames)
        except Exception as exc:
            failure = self._answers.undecodable(exc, call_id, True, f"spawn of {name!r}", 0, route)
            # Its calls answer this too, not "no actor": the class or an argument
            # did not unpickle here (a class of a script run by multiprocessing).
            self._failed_inits[message.actor_id] = dataclasses.replace(
                failure, message=f"{failure.message}; so the actor was never made"
            )
            return
        # A spawn through a reference names its spawner's supervision port too.
        cls, args, kwargs, *supervisor = decoded
        if supervisor:
            self._answers.supervisors[message.actor_id] = supervisor[0]
        shape = Shape(message.labels, message.sizes, message.ranks)
        host = self._host
        ctx = Context(
            shape.point_of_rank(host.rank),
            len(shape),
            host.mesh_name,
            name,
            actor_id=message.actor_id,
            procs=host.procs_ref,
            shape=shape,
        )
        previous = _context.set_current(ctx)
        self._active.append(message.actor_id)
        try:
            instance = self._user_code(
                f"spawn {name!r}", _construct, (cls, args, kwargs), awaits=False
            )
        except BaseException as exc:
            failure = self._failure_of(exc)
            self._failed_inits[message.actor_id] = never_constructed(failure)
            route.send(Failure(call_id, failure, False))
            return
        finally:
            self._active.pop()
            _context.set_current(previous)
        self.live[message.actor_id] = LiveActor(instance, dataclasses.replace(ctx, actor=instance))
        route.send(Value(call_id))

    def on_call(self, message: Call, frames: list[Any], route: Route) -> None:
        call_id, actor_id, endpoint, reply = (
            message.call_id,
            message.actor_id,
            message.endpoint,
            message.reply,
        )
        live = self.live.get(actor_id)
        if live is not None:
            try:  # the actor's own code may run here (a property, __getattribute__)
                method = getattr(live.instance, endpoint, None)
                facts = live.facts(endpoint, method)
            except Exception as exc:  # the call's error, not the rank's end
                label = f"{live.label}.{endpoint}"
                self._report(call_id, reply, actor_id, label, self._failure_of(exc), route)
                return
            label = facts.label
        else:
            label = f"actor.{endpoint}"
        try:
            args, kwargs = decode_payload(frames)
        except Exception as exc:
            self._answers.undecodable(exc, call_id, reply, label, actor_id, route)
            return
        if live is None:
            ended = self._failed_actors.get(actor_id)
            if ended is not None:
                # A broadcast to it is dropped: its owner heard of the failure once.
                if message.reply:
                    route.send(Failure(call_id, ended, False))
                return
            failed = self._failed_inits.get(actor_id)
            if failed is not None:
                self._report(call_id, reply, actor_id, label, failed, route)
                return
            error = LookupError(
                f"no actor {actor_id} on rank {self._host.rank}: it was stopped, or its spawn "
                "has not reached this rank yet (a mesh passed on before actors.initialized "
                "was done)"
            )
            self._report(call_id, reply, actor_id, label, self._failure_of(error), route)
            return
        if facts.response_port:
            args = (_ResponsePort(self._answers, route, call_id if reply else 0), *args)
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
            result = self._user_code(label, method, args, kwargs)
        except BaseException as exc:
            if _ends_actor(exc, facts.response_port):
                self._end_actor(live, exc, call_id, reply, label, route, args)
            else:
                self._report(call_id, reply, actor_id, label, self._failure_of(exc), route)
            return
        finally:
            self._active.pop()
            _context.set_current(previous)
        if reply:
            self._reply_value(call_id, result, route)

    def _start_task(
        self,
        live: LiveActor,
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

        running = self._running
        loop = self._inbox.event_loop()
        call_id, actor_id = message.call_id, message.actor_id
        ticket = running.ticket if message.reply else NO_TICKET
        call = TaskCall(ticket, actor_id, label, ctx, time.monotonic(), loop)
        port_answers = bool(args) and isinstance(args[0], _ResponsePort)

        async def run() -> None:
            call.started = True
            _context.set_task_context(ctx)
            try:
                if call.stopping or call.interrupted:  # before its body began
                    raise asyncio.CancelledError
                call.coro = method(*args, **kwargs)
                result = await stepped(call.coro, call, running.enter_step, running.leave_step)
            except asyncio.CancelledError as exc:
                failure = self._cancelled(call, exc)
                if reply or not call.stopping:
                    self._report(call_id, reply, actor_id, label, failure, route)
                elif args and isinstance(args[0], _ResponsePort):
                    args[0].fail(failure)  # its caller may still wait on the port
                # (else a broadcast: nobody waits, and a stop fails no actor mesh)
            except BaseException as exc:
                if _ends_actor(exc, port_answers):
                    self._end_actor(live, exc, call_id, reply, label, route, args)
                else:
                    self._report(call_id, reply, actor_id, label, self._failure_of(exc), route)
            else:
                if reply:
                    self._reply_value(call_id, result, route)
            finally:
                live.tasks.discard(call)
                if ticket[1]:
                    running.task_ended(ticket)

        if ticket[1]:
            running.task_started(call)
        call.task = self._inbox.start_task(run())
        live.tasks.add(call)

    def _end_actor(
        self,
        live: LiveActor,
        exc: BaseException,
        call_id: int,
        reply: bool,
        label: str,
        route: Route,
        args: tuple,
    ) -> None:
        """An endpoint of ``live`` raised ``exc``, which ends its actor on this rank,
        as in Monarch (:func:`_ends_actor`): its call answers a failure marked
        ``actor_failed`` (the caller raises SupervisionError), and so does every
        later call to it; its owner hears of it once (``__supervise__``, else
        ``unhandled_fault_hook``); then it stops as an actor mesh's stop stops it
        (its other calls cancelled, ``__cleanup__(exc)``, the meshes it started
        stopped: "the actor and all its descendants have failed")."""
        actor_id = live.context.actor_id
        failure = self._failure_of(exc)
        answer = dataclasses.replace(
            failure, message=_ended_text(live, label, failure, exc), actor_failed=True
        )
        if self.live.get(actor_id) is live:  # the first of its calls to end it
            del self.live[actor_id]
            self._failed_actors[actor_id] = answer
            # No caller: supervision takes it (the controller, or its spawner's port).
            why = dataclasses.replace(failure, actor_failed=True)
            self._report(0, False, actor_id, label, why, route)
            # Between messages: this may be one of its own tasks, which the stop waits for.
            self._inbox.post(lambda: self._cleanup(live, exc))
        port = args[0] if args and isinstance(args[0], _ResponsePort) else None
        if port is not None:
            port.fail(answer)
        elif reply:
            route.send(Failure(call_id, answer, False))

    def _cancelled(self, call: TaskCall, exc: BaseException) -> RemoteFailure:
        """The failure an async call reports when its task was cancelled."""
        if call.stopping:
            failure = self._failure_of(exc)
            return dataclasses.replace(
                failure, message=f"{call.label} was cancelled: its actor was stopped"
            )
        if call.interrupted:
            return self._failure_of(KeyboardInterrupt().with_traceback(exc.__traceback__))
        return self._failure_of(exc)

    def describe_awaiting(self) -> str:
        """(wire thread) Below a status's stack: the async endpoint calls in flight
        whose step is not running, and where each awaits. Not in the stack's
        format, so that ``%mesh why`` reads the main thread's frames only."""
        running = self._running.ticket
        lines = []
        for live in list(self.live.values()):
            for call in list(live.tasks):
                if call.ticket[1] and call.ticket == running:
                    continue  # its step runs: the stack above shows it
                place = where_awaiting(call, not_user_code)
                lines.append(f"  {call.label} awaits at {place}" if place else f"  {call.label}")
        if not lines:
            return ""
        return f"{AWAITING_HEADING}{len(lines)}):\n" + "\n".join(sorted(lines)) + "\n"

    # -- stopping ----------------------------------------------------------------------

    def stop(self, actor_id: int) -> None:
        """Stop actor ``actor_id`` if it lives here (see :meth:`_cleanup`)."""
        live = self.live.pop(actor_id, None)
        self._answers.supervisors.pop(actor_id, None)
        if live is not None:
            # Its later calls (from any caller) raise SupervisionError, as Monarch's.
            self._failed_actors[actor_id] = RemoteFailure(
                self._host.rank, "Stopped", _stopped_text(live, self._host.rank), "", True
            )
            self._cleanup(live)

    def stop_all(self) -> None:
        """Stop every actor here, and forget the spawns that failed."""
        for actor_id in list(self.live):
            self._cleanup(self.live.pop(actor_id))
        self._failed_inits.clear()
        self._failed_actors.clear()
        self._answers.supervisors.clear()

    def _cleanup(self, live: LiveActor, error: BaseException | None = None) -> None:
        """A stopped actor: cancel its async calls in flight and let them unwind
        (their ``except CancelledError`` and ``finally`` run), then ``__cleanup__``
        (of None, or of the ``error`` that ended it), then stop the meshes it
        started (it may still use them in ``__cleanup__``)."""
        self._stop_tasks(live.tasks)
        cleanup = getattr(live.instance, "__cleanup__", None)
        if cleanup is not None:
            previous = _context.set_current(live.context)
            try:
                self._user_code(f"{live.label}.__cleanup__", cleanup, (error,))
            except BaseException as exc:
                failure = self._failure_of(exc)
                self._send(
                    BroadcastFailure(live.context.actor_id, f"{live.label}.__cleanup__", failure)
                )
            finally:
                _context.set_current(previous)
        self._stop_owned(live)

    def _stop_owned(self, live: LiveActor) -> None:
        """Stop what the actor started, newest first, as Monarch's recursive stop:
        its actor meshes (their ``__cleanup__`` runs) and its process meshes. An
        actor mesh on a process mesh it was handed may live in this very process,
        whose stop waits behind this one: it is sent, not waited for."""
        for mesh in _owned.take_owned(live.instance):
            try:
                stopped = mesh.stop()
                if not isinstance(mesh, PeerActorMesh):
                    stopped.exception(timeout=OWNED_STOP_WAIT_S)
            except Exception as exc:  # stopped already, unreachable: it is going anyway
                print(
                    f"monarch_nb: stopping {live.label}'s {mesh!r}: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )

    def _stop_tasks(self, calls: set[TaskCall]) -> None:
        """Cancel ``calls`` and run the actors' loop until their tasks have ended
        (serving calls to other actors meanwhile: a handler may await one)."""
        if not calls:
            return
        tasks = []
        for call in list(calls):
            call.stopping = True
            call.cancel()
            tasks.append(call.task)
        self._inbox.wait_for(tasks)

    # -- supervision of meshes our actors started -------------------------------------

    def on_child_failure(self, owner: Any, error: MeshFailure) -> None:
        """(any thread) A mesh ``owner`` started failed: its ``__supervise__`` runs
        on the main thread."""
        self._inbox.post(lambda: self._supervise(owner, error))

    def _supervise(self, owner: Any, error: MeshFailure) -> None:
        # As an endpoint call of the owner: its context, interruptible, and an
        # ``async def __supervise__`` awaited on the actor's loop.
        live = next((a for a in self.live.values() if a.instance is owner), None)
        previous = _context.set_current(live.context if live else None)
        label = f"{type(owner).__name__}.__supervise__"
        # The owner's own calls wait until it has handled the failure (it may
        # spawn a new child mesh meanwhile), as they wait for its sync endpoints.
        self._active.append(live.context.actor_id if live else 0)
        try:
            handled = self._user_code(label, owner.__supervise__, (error,))
            why = f"its __supervise__ returned {handled!r}"
        except BaseException as exc:
            handled = False
            why = f"its __supervise__ raised {type(exc).__name__}: {exc}"
        finally:
            self._active.pop()
            _context.set_current(previous)
        if not handled:
            # The headline names the failed actor and its point, so the chain of
            # descendants reads as one story up to the client.
            self._send(
                Supervision(f"{type(owner).__name__} did not handle ({why}): {error.headline()}")
            )


def _ends_actor(exc: BaseException, port_answers: bool) -> bool:
    """Whether ``exc``, raised out of an endpoint, ends its actor, as in Monarch: a
    ``BaseException`` that is not an ``Exception`` (``SystemExit``, a class of
    one's own), or anything out of an ``explicit_response_port`` endpoint (its
    caller waits on the port, not on a return). Not ``KeyboardInterrupt`` nor a
    cancellation: that is how an interrupt or a stop reaches user code here."""
    if isinstance(exc, Exception):
        return port_answers
    if isinstance(exc, KeyboardInterrupt):
        return False
    import asyncio  # (only here, on a failure: a worker starts without it)

    return not isinstance(exc, asyncio.CancelledError)


def _ended_text(live: LiveActor, label: str, failure: RemoteFailure, exc: BaseException) -> str:
    """What a call to an actor that ``exc`` ended answers: which actor, where, why,
    and what to do (Monarch's supervision words first, as its programs match them)."""
    if isinstance(exc, _context.ActorAborted):
        kind = "by context().actor_instance.abort()"
    elif isinstance(exc, Exception):
        kind = "out of an explicit_response_port endpoint"
    else:
        kind = "a BaseException that is not an Exception"
    why = (
        f"{label} raised {failure.type_name}: {failure.message} on rank {failure.rank}, "
        f"{kind}, which ends its actor (as in Monarch)"
    )
    return _failed_actor_text(live, why)


def _stopped_text(live: LiveActor, rank: int) -> str:
    return _failed_actor_text(live, f"it was stopped on rank {rank} (its actor mesh's stop())")


def _failed_actor_text(live: LiveActor, why: str) -> str:
    """Monarch's supervision words first (its programs match them), then ``why``
    and what to do."""
    ctx = live.context
    cls = type(live.instance)
    return (
        f"The actor {cls.__module__}.{cls.__qualname__} {ctx.actor_name}{ctx.point} and all "
        f"its descendants have failed: {why}; spawn the actor mesh {ctx.actor_name!r} "
        "again to use it"
    )


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
