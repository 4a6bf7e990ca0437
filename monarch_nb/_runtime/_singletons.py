"""``get_or_spawn_controller``: one actor per name, in the controller's own process.

The first call with a name spawns ``Class(*args, **kwargs)`` on the
controller's process (:func:`~._local_actors.this_proc`: its actors run on a
thread of the controller); every later call with that name gets that same
actor mesh, and ignores its arguments. As in Monarch, the name is looked up
in one table per client, whoever asks:

- on the controller, and in actors of the controller's own process, the
  table is this module's ``_spawned``;
- in an actor on a rank, the call goes to the controller's table through a
  small actor (``_Singletons``) that the controller spawns beside the others
  when it makes its first singleton. Its address travels down to the
  processes started afterwards in ``MONARCH_NB_SINGLETONS``, as the run
  directory does, so a rank started before the controller's first
  ``get_or_spawn_controller`` cannot reach it, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any, TypeVar

from .._model._errors import MeshUsageError
from .._model._future import Future, completed, failed
from .._model._public import publish
from .._wire._rundir import tree_root
from . import _peer, _refs
from ._actors import Actor, endpoint
from ._local_actors import this_proc
from ._peer_mesh import PeerActorMesh

A = TypeVar("A", bound=Actor)

ENV_VAR = "MONARCH_NB_SINGLETONS"

_lock = threading.Lock()
_spawned: dict[str, Any] = {}  # name -> the actor mesh (a one-process mesh on this_proc())
_registry: Any = None  # the _Singletons actor ranks ask, once made


def get_or_spawn_controller(name: str, Class: type[A], *args: Any, **kwargs: Any) -> Future[A]:
    """The actor named ``name`` in the controller's process, spawned on first use.

    A future of the actor mesh (one actor, on the controller's ``this_proc()``):
    ``.get()`` it, or ``await`` it in an ``async`` endpoint. The first call with
    ``name`` spawns ``Class(*args, **kwargs)``; later calls, from the
    controller or from any actor, get the same mesh. Calls to it wait behind
    its ``__init__``, and raise its error if ``__init__`` raised.

    Example::

        store = get_or_spawn_controller("store", Store).get()
        store.put.call_one("a", 1).get()
    """
    if not isinstance(name, str) or not name:
        raise MeshUsageError(f"get_or_spawn_controller needs a name (a str), got {name!r}")
    if not (isinstance(Class, type) and issubclass(Class, Actor)):
        raise MeshUsageError(
            f"get_or_spawn_controller({name!r}, ...) needs a subclass of monarch_nb.Actor, "
            f"got {Class!r}"
        )
    if _in_a_rank():
        return _registry_of_the_controller().get_or_spawn.call_one(name, Class, args, kwargs)
    try:
        return completed(get_or_spawn_here(name, Class, args, kwargs))
    except Exception as exc:
        return failed(exc)


def get_or_spawn_here(name: str, cls: type[A], args: tuple, kwargs: dict) -> Any:
    """The actor mesh ``name`` of this process's table, spawned if new."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = this_proc().spawn("singletons", _Singletons)
            os.environ[ENV_VAR] = _describe(_registry._ref)
        actors = _spawned.get(name)
        if actors is None:
            actors = _spawned[name] = this_proc().spawn(name, cls, *args, **kwargs)
    init = actors.initialized
    error = init.exception(timeout=0) if init.done() else None
    if error is not None:
        raise error
    return actors


class _Singletons(Actor):
    """The controller's table, for actors on ranks (runs in the controller)."""

    @endpoint
    def get_or_spawn(self, name: str, cls: type[Actor], args: tuple, kwargs: dict) -> Any:
        return get_or_spawn_here(name, cls, args, kwargs)


def _in_a_rank() -> bool:
    node = _peer.node_or_none()
    return node is not None and node.home is not None


def _describe(ref: _refs.ActorRef) -> str:
    """The registry's reference as JSON, for the environment of processes started later."""
    return json.dumps(
        {
            "root": tree_root(),  # whose tree: a stale value inherited from another is ignored
            "procs": dataclasses.asdict(ref.procs),
            "actor_id": ref.actor_id,
            "spawned": dataclasses.asdict(ref.spawned),
        }
    )


def _registry_of_the_controller() -> PeerActorMesh[_Singletons]:
    text = os.environ.get(ENV_VAR, "")
    data = json.loads(text) if text else None
    if data is None or data.get("root") != tree_root():
        raise MeshUsageError(
            "get_or_spawn_controller() in an actor asks the controller, but this rank's "
            "processes were started before the controller made its first singleton: call "
            "get_or_spawn_controller(...) on the controller before spawn_procs() "
            "(any name), or spawn the actor there and pass it to this one"
        )
    procs = _refs.ProcsRef.from_json(data["procs"])
    spawned = data["spawned"]
    view = _refs.ViewRef(
        tuple(spawned["labels"]),
        tuple(spawned["sizes"]),
        tuple(tuple(run) for run in spawned["runs"]),
    )
    ref = _refs.ActorRef(
        procs, data["actor_id"], "singletons", "_Singletons", ("get_or_spawn",), view
    )
    return PeerActorMesh(ref, view.shape())


publish(globals())
