"""The actor base class and the ``@endpoint`` mark: what user code defines.

Both sides use these: the controller to list a class's endpoints, workers
to construct the actors and run the endpoints.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from .._model._public import publish

if TYPE_CHECKING:
    from .._model._errors import MeshFailure

P = ParamSpec("P")
R = TypeVar("R")

_ENDPOINT_MARK = "_monarch_nb_endpoint"


class Actor:
    """Base class of actors: subclass it and mark methods with :func:`endpoint`.

    An actor instance lives in a worker process, one per point of the mesh it
    is spawned on. Calls to one actor start in the order sent. Calls of its
    ``async def`` endpoints are tasks on the process's event loop that
    interleave at their awaits; a sync endpoint runs to its end before anything
    else on the process runs (docs/actors.md, "What runs concurrently").

    ``__supervise__(failure)`` is called on the actor (in its worker) when a
    process mesh that this actor spawned fails. Return True to say "handled":
    the child mesh stays failed, and nothing else happens. Return False (the
    default) or raise, and the failure propagates: the process mesh this
    actor lives in is marked failed, with the child's failure as the cause.
    """

    def __supervise__(self, failure: MeshFailure) -> bool:
        return False

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """This actor's logger, as Monarch's: named by its class, at level DEBUG.
        Its records go to the rank's output and log file like any ``logging`` record."""
        logger = logging.getLogger(type(self).__name__)
        logger.setLevel(logging.DEBUG)
        return logger


_RESPONSE_PORT_MARK = "_monarch_nb_explicit_response_port"
_PROPAGATE_MARK = "_monarch_nb_propagate"
_CONCURRENT_MARK = "_monarch_nb_concurrent"


def endpoint(
    method: Callable[P, R] | None = None,
    *,
    explicit_response_port: bool = False,
    propagate: Any = None,
    instrument: bool = False,
) -> Any:
    """Mark an actor method (sync or ``async def``) as callable across the mesh.

    ``@endpoint`` or ``@endpoint(...)``. With ``explicit_response_port=True``
    the method gets a :class:`~monarch_nb.actor.Port` after ``self`` and answers
    by ``port.send(value)`` (or ``port.exception(exc)``), from any thread and at
    any time, instead of returning. ``propagate`` is for ``rref``: a function
    of the endpoint's arguments (without ``self``) that returns tensors shaped as
    the endpoint's result; ``rref`` runs it on fake tensors instead of asking a
    rank (Monarch's ``"inspect"``, ``"cached"`` and ``"mocked"`` ask the first
    rank). ``instrument`` is accepted for Monarch's API (calls are on the
    timeline anyway). Inside the actor the method stays an ordinary method.
    """

    def mark(fn: Callable[P, R]) -> Callable[P, R]:
        setattr(fn, _ENDPOINT_MARK, True)
        if explicit_response_port:
            setattr(fn, _RESPONSE_PORT_MARK, True)
        if propagate is not None:
            setattr(fn, _PROPAGATE_MARK, propagate)
        return fn

    return mark if method is None else mark(method)


def concurrent_endpoint(
    method: Callable[P, R] | None = None,
    *,
    explicit_response_port: bool = False,
    propagate: Any = None,
    instrument: bool = False,
) -> Any:
    """An ``async def`` endpoint whose calls interleave at their awaits (Monarch's
    ``@concurrent_endpoint``). Every ``async def`` endpoint's calls do here, so
    this is ``@endpoint`` that insists on an ``async def``. It takes
    ``@endpoint``'s options itself and, as Monarch's, refuses (ValueError) a
    sync method and a method already marked ``@endpoint``."""

    def mark(fn: Any) -> Any:
        if getattr(fn, _ENDPOINT_MARK, False):
            raise ValueError(
                f"@concurrent_endpoint does not wrap @endpoint ({fn.__qualname__}): "
                "drop @endpoint and pass its options to @concurrent_endpoint(...)"
            )
        if not inspect.iscoroutinefunction(fn):
            raise ValueError(
                f"@concurrent_endpoint can only wrap async endpoints, got "
                f"{getattr(fn, '__qualname__', fn)!r}, which is not an async def"
            )
        endpoint(
            fn,
            explicit_response_port=explicit_response_port,
            propagate=propagate,
            instrument=instrument,
        )
        setattr(fn, _CONCURRENT_MARK, True)
        return fn

    return mark if method is None else mark(method)


def wants_response_port(method: Any) -> bool:
    return bool(getattr(method, _RESPONSE_PORT_MARK, False))


def is_concurrent(method: Any) -> bool:
    return bool(getattr(method, _CONCURRENT_MARK, False))


def endpoint_names(cls: type) -> list[str]:
    """Names of the endpoints a class defines, sorted."""
    return sorted(
        name for name in dir(cls) if getattr(getattr(cls, name, None), _ENDPOINT_MARK, False)
    )


def check_endpoint_kinds(cls: type) -> None:
    """Refuse, as Monarch does at spawn, an actor class whose endpoints are some
    ``def`` and some ``async def``, or whose ``__cleanup__`` is of the other kind
    (ValueError). Why: a sync endpoint that waits (on a call, a lock) while async
    calls of the same actor are in flight holds the thread their loop needs."""
    sync: list[str] = []
    awaited: list[str] = []
    for name in endpoint_names(cls):
        (awaited if inspect.iscoroutinefunction(getattr(cls, name)) else sync).append(name)
    cleanup = getattr(cls, "__cleanup__", None)
    name = cls.__qualname__
    fix = (
        "make them all def or all async def; to run some calls of an async actor "
        "side by side, mark them @concurrent_endpoint (docs/actors.md)"
    )
    if sync and awaited:
        raise ValueError(
            f"{name} mixes both async and sync endpoints (sync: {', '.join(sync)}; "
            f"async: {', '.join(awaited)}), which Monarch refuses too: {fix}"
        )
    if cleanup is None:
        return
    if sync and inspect.iscoroutinefunction(cleanup):
        raise ValueError(
            f"{name} has sync endpoints ({', '.join(sync)}) but an async __cleanup__: "
            "make __cleanup__ a plain def too"
        )
    if awaited and not inspect.iscoroutinefunction(cleanup):
        raise ValueError(
            f"{name} has async endpoints ({', '.join(awaited)}) but a sync __cleanup__: "
            "make __cleanup__ an async def too"
        )


def endpoint_propagators(cls: type) -> dict[str, Any]:
    """``{endpoint name: its propagate=}`` for the endpoints of ``cls`` that have one."""
    found = {}
    for name in endpoint_names(cls):
        propagate = getattr(getattr(cls, name), _PROPAGATE_MARK, None)
        if propagate is not None:
            found[name] = propagate
    return found


publish(globals())
