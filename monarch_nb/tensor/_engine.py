"""The controller side of the tensor engine: one :class:`Engine` per process group.

It owns the :class:`~._worker.TensorWorker` actors (one per rank, spawned on
first use), hands out ref ids, and keeps the batch of ops not yet sent. Ops are
sent without waiting (``broadcast``), in the order they were issued, each run
of consecutive ops for the same ranks as one message; the batch goes out
when a value is read, when ``activate()`` exits, and every
:data:`FLUSH_EVERY` ops. Tensors the controller dropped are freed on the
ranks by the next batch.
"""

from __future__ import annotations

import itertools
import os
import secrets
import sys
import sysconfig
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .._controller._proc_mesh import ProcMesh
from .._model._errors import MeshFailure, MeshUsageError
from .._model._future import Future
from .._model._shape import Shape
from .._model._value_mesh import ValueMesh
from .._runtime._peer_mesh import PeerProcMesh
from ._errors import DeferredError, MeshTensorError
from ._worker import TensorWorker

if TYPE_CHECKING:
    from .._controller._process_group import ProcGroup

FLUSH_EVERY = 256

# The controller's engines, one per process group (held weakly: a forgotten
# mesh takes its engine along), and an actor's, one per process group it
# drives (by the group's id and generation: a reference has no object to key on).
_engines: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()
_peer_engines: dict[tuple[str, int], Engine] = {}

# Frames of these files are machinery; the first frame outside them is the
# user's line that issued an op (autograd and optimizers included).
_INTERNAL = tuple(
    os.path.dirname(path) + os.sep
    for path in (torch.__file__, os.path.dirname(__file__), sysconfig.get_paths()["stdlib"] + "/x")
)


def source_line() -> str:
    """``file:line`` of the innermost caller outside torch, monarch_nb and the stdlib."""
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Owner:
    """Who drives the ranks: the controller (a ProcGroup it started) or an actor
    (a reference to a process mesh it holds). The engine needs only these four."""

    name: str

    def generation(self) -> int:
        raise NotImplementedError

    def flat(self) -> Any:
        """The whole group as a one-dimensional mesh ``rank``, to spawn on."""
        raise NotImplementedError


class GroupOwner(Owner):
    def __init__(self, group: ProcGroup) -> None:
        self.group = group
        self.name = group.name

    def generation(self) -> int:
        return self.group.generation

    def flat(self) -> ProcMesh:
        ranks = self.group.shape.ranks
        return ProcMesh(self.group, Shape(["rank"], [len(ranks)], ranks))


class PeerOwner(Owner):
    """A process mesh driven from inside an actor. A restart of that mesh gives
    new inboxes, so calls to the old ones fail on their own: no generation to
    compare."""

    def __init__(self, procs: PeerProcMesh) -> None:
        self.ref = procs._ref
        self.name = self.ref.name

    def generation(self) -> int:
        return self.ref.generation

    def flat(self) -> PeerProcMesh:
        ranks = self.ref.world.shape().ranks
        return PeerProcMesh(self.ref, Shape(["rank"], [len(ranks)], ranks))


class View:
    """A mesh view that tensors live on: its shape, and its DeviceMesh once made."""

    __slots__ = ("__weakref__", "engine", "mesh_id", "procs", "shape")

    def __init__(self, engine: Engine, procs: Any) -> None:
        self.engine = engine
        self.procs = procs
        self.shape: Shape = procs.shape
        self.mesh_id = 0

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.shape.ranks

    def __repr__(self) -> str:
        return f"{self.procs.name!r} {self.shape!r}"


class Engine:
    """Batches, ref ids and the rank-side actors of one process group."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.generation = owner.generation()
        flat = owner.flat()
        ranks = flat.shape.ranks
        self.token = secrets.token_hex(8)  # names this engine to its rank-side actors
        self.actors = flat.spawn("tensor_engine", TensorWorker, self.token)
        self.device = torch.device(self.actors.device_name.call().get().values()[0])
        self.all_ranks: tuple[int, ...] = tuple(ranks)
        self._index = {r: i for i, r in enumerate(ranks)}
        self.pending: list[tuple[tuple[int, ...], tuple]] = []
        self.drops: deque[int] = deque()  # appended by finalizers, on any thread
        self._views: dict[Shape, View] = {}
        self._refs = itertools.count(1)
        self._mesh_ids = itertools.count(1)
        self.transfers = itertools.count(1)

    # -- views and ids --------------------------------------------------------------

    def view(self, procs: Any) -> View:
        view = self._views.get(procs.shape)
        if view is None:
            view = self._views[procs.shape] = View(self, procs)
        return view

    def new_ref(self) -> int:
        return next(self._refs)

    def device_mesh(self, view: View) -> int:
        """The id of ``view``'s DeviceMesh on the ranks, made on first use."""
        if not view.shape.labels:
            raise MeshUsageError(
                f"mesh {view!r} has no dimensions: collectives and sharding need at least one"
            )
        if not view.mesh_id:
            view.mesh_id = next(self._mesh_ids)
            shape = view.shape
            # Every rank of the group takes part in making process groups.
            self.record(
                self.all_ranks,
                ("view", view.mesh_id, list(shape.labels), list(shape.sizes), list(shape.ranks)),
            )
        return view.mesh_id

    # -- sending ----------------------------------------------------------------------

    def check(self) -> None:
        if self.owner.generation() != self.generation:
            raise MeshFailure(
                f"process mesh {self.owner.name!r} restarted: its mesh tensors are gone; "
                "make them again"
            )

    def record(self, ranks: tuple[int, ...], op: tuple) -> None:
        self.pending.append((ranks, op))
        if len(self.pending) + len(self.drops) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Send every op not yet sent, in order: one message per run of the same ranks."""
        drops = self.drops
        if drops:
            refs = [drops.popleft() for _ in range(len(drops))]
            self.pending.append((self.all_ranks, ("drop", refs)))
        pending, self.pending = self.pending, []
        if not pending:
            return
        self.check()
        start = 0
        for i in range(1, len(pending) + 1):
            if i == len(pending) or pending[i][0] != pending[start][0]:
                ranks = pending[start][0]
                self._actors_on(ranks).run.broadcast([op for _, op in pending[start:i]])
                start = i

    def _actors_on(self, ranks: tuple[int, ...]) -> Any:
        if ranks == self.all_ranks:
            return self.actors
        return self.actors.slice(rank=[self._index[r] for r in ranks])

    # -- reading ----------------------------------------------------------------------

    def read(
        self, view: View, ref: int | list[int], value_rank: int | None = None
    ) -> Future[ValueMesh[Any]]:
        """Each rank's value of ``ref`` (a list of values for a list of refs; only
        ``value_rank``'s if given), or the MeshTensorError naming the op that failed
        on any rank."""
        self.flush()
        call = self._actors_on(view.ranks).read.call(ref, value_rank)
        return then(call, lambda replies: _values(view.shape, replies))

    def read_rank(self, rank: int, ref: int) -> Future[Any]:
        """The value of ``ref`` on ``rank`` alone (any object), or its MeshTensorError."""
        return self._ask(rank, "read", ref, rank)

    def describe(self, rank: int, ref: int) -> Future[Any]:
        """The structure of ``ref``'s value on ``rank``, tensors as TensorMeta."""
        return self._ask(rank, "describe", ref)

    def _ask(self, rank: int, endpoint: str, *args: Any) -> Future[Any]:
        self.flush()
        call = getattr(self._actors_on((rank,)), endpoint).call(*args)
        return then(call, lambda replies: _values(replies.shape, replies).values()[0])

    def stats(self) -> ValueMesh[dict[str, int]]:
        """Per rank: how many tensors it holds (``refs``), for tests and debugging."""
        self.flush()
        return self.actors.stats.call().get()


def _values(shape: Shape, replies: ValueMesh[tuple[str, Any]]) -> ValueMesh[Any]:
    errors: list[DeferredError] = [v for kind, v in replies.values() if kind == "err"]
    if errors:
        raise MeshTensorError.of(errors)
    return ValueMesh(shape, [v for _, v in replies.values()])


def then(future: Future[Any], fn: Callable[[Any], Any]) -> Future[Any]:
    result: Future[Any] = Future._new()

    def done(f: Future[Any]) -> None:
        try:
            result.set_result(fn(f.get()))
        except BaseException as exc:
            result.set_exception(exc)

    future.add_done_callback(done)
    return result


def engine_for(procs: Any) -> Engine:
    """The engine of ``procs``'s process group (started on first use, and again
    after a restart): the controller's, or, for a process mesh an actor holds,
    that actor's process's own, so the actor drives the ranks itself."""
    if isinstance(procs, ProcMesh):
        group = procs._group
        engine = _engines.get(group)
        if engine is None or engine.generation != group.generation:
            engine = _engines[group] = Engine(GroupOwner(group))
        return engine
    if isinstance(procs, PeerProcMesh):
        key = (procs._ref.group, procs._ref.generation)
        engine = _peer_engines.get(key)
        if engine is None:
            engine = _peer_engines[key] = Engine(PeerOwner(procs))
        return engine
    raise MeshUsageError(f"expected a ProcMesh (procs.activate(), ...), got {procs!r}")
