"""``Accumulator``: call an endpoint on every actor of a mesh and fold the replies.

``Accumulator(counters.value, 0, operator.add).accumulate()`` is a future of
``0 + v0 + v1 + ...``, one ``v`` per actor the endpoint's mesh (or slice)
holds, as Monarch's ``Accumulator``. The replies are folded in rank order once
all have come, so a ``combine`` that is not commutative still gives one answer;
the first failing rank fails the future, as ``call()`` does.

``combine`` may instead name a reducer, ``"sum"``, ``"min"``, ``"max"`` or
``"equal"`` (:mod:`.._model._reducers`): then the replies fold on their way
back, by each host's agent for its ranks and the hosts below it in the cast
tree, and the controller reads one partial fold per subtree, not a reply per
rank (docs/scale.md). The answer and the errors are the same on one host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .._model._errors import MeshUsageError
from .._model._future import Future, completed, failed
from .._model._public import publish
from .._model._reducers import Partial, check_reducer
from .._model._value_mesh import ValueMesh
from ._endpoint import EndpointBase
from ._reduced_call import FOLD_PREFIX

R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[R, A]):
    """Fold the replies of one endpoint's every actor into one value.

    Args:
        endpoint: an endpoint of an actor mesh (``actors.value``, not the
            class's ``Counter.value``); a slice's endpoint folds that slice.
        identity: the value before the first reply.
        combine: ``combine(folded, reply)``, the new folded value; or the name
            of a reducer the host agents run on the way back: ``"sum"``,
            ``"min"``, ``"max"`` or ``"equal"`` (numbers; see
            ``monarch_nb._model._reducers``).

    Example::

        total = Accumulator(counters.value, 0, operator.add).accumulate().get()
        total = Accumulator(counters.value, 0, "sum").accumulate().get()  # folded by the hosts
    """

    def __init__(self, endpoint: EndpointBase[R], identity: A, combine: Callable[[A, R], A] | str):
        self._reducer: str | None = None
        if isinstance(combine, str):
            self._reducer = check_reducer(combine, identity)
        elif not callable(combine):
            raise MeshUsageError(
                f"Accumulator's combine must be a function of (folded, reply), got {combine!r}"
            )
        if not isinstance(endpoint, EndpointBase) and not callable(
            getattr(endpoint, "stream", None)
        ):
            raise MeshUsageError(
                f"Accumulator needs an endpoint of an actor mesh, got {endpoint!r}: "
                "write Accumulator(actors.value, 0, operator.add), not "
                "Accumulator(Counter.value, ...)"
            )
        self._endpoint = endpoint
        self._identity = identity
        self._combine: Callable[[A, R], A] = combine if callable(combine) else _named

    def _reduce(self, args: tuple, kwargs: dict) -> Future[A]:
        """A named reducer: folded on the way back where the endpoint can (a mesh
        the controller calls), else here, over call()'s ValueMesh."""
        assert self._reducer is not None
        endpoint: Any = self._endpoint
        folded: Future[A] = Future._new()
        identity, reducer = self._identity, self._reducer

        def finish(done: Future[Any]) -> None:
            error = done.exception(timeout=0)
            if error is not None:
                folded.set_exception(error)
                return
            partial = done.get(timeout=0)
            if isinstance(partial, ValueMesh):
                mesh, partial = partial, Partial(reducer)
                for rank, value in enumerate(mesh.values()):
                    wrong = partial.add(rank, value)
                    if wrong is not None:
                        folded.set_exception(TypeError(f"rank {rank}: {wrong}"))
                        return
            try:
                folded.set_result(partial.finish(identity))
            except ValueError as exc:  # "equal": the ranks differ
                folded.set_exception(exc)

        if getattr(endpoint, "_folds_on_the_way", False):
            call = endpoint._send(endpoint._mesh._shape, FOLD_PREFIX + reducer, args, kwargs)
            call.future.add_done_callback(finish)
        else:
            endpoint.call(*args, **kwargs).add_done_callback(finish)
        return folded

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Call the endpoint with ``args`` on every actor; a future of the folded replies.

        ``await`` it or ``.get()`` it. It fails with the call's error if a rank
        fails, or with what ``combine`` raised.
        """
        if self._reducer is not None and isinstance(self._endpoint, EndpointBase):
            return self._reduce(args, kwargs)
        if not isinstance(self._endpoint, EndpointBase):
            return self._fold_stream(args, kwargs)
        replies = self._endpoint.call(*args, **kwargs)
        folded: Future[A] = Future._new()
        replies.add_done_callback(lambda done: self._fold(done, folded))
        return folded

    def _fold(self, replies: Future[ValueMesh[R]], folded: Future[A]) -> None:
        error = replies.exception(timeout=0)
        if error is not None:
            folded.set_exception(error)
            return
        try:
            value = self._identity
            for reply in replies.get(timeout=0).values():
                value = self._combine(value, reply)
        except Exception as exc:
            folded.set_exception(exc)
            return
        folded.set_result(value)

    def _fold_stream(self, args: tuple, kwargs: dict) -> Future[A]:
        # Something else with Monarch's stream() (a stand-in in a test, a wrapper of
        # an endpoint): fold what it yields, in its order, as Monarch's does.
        try:
            value = self._identity
            item: Any
            for item in self._endpoint.stream(*args, **kwargs):
                if isinstance(item, tuple) and len(item) == 2:
                    item = item[1]  # (point, value), as our stream() yields them
                elif callable(getattr(item, "get", None)):
                    item = item.get()  # a future of the value, as Monarch's yields
                value = self._combine(value, item)
        except Exception as exc:
            return failed(exc)
        return completed(value)

    def __repr__(self) -> str:
        return f"Accumulator({self._endpoint!r}, {self._identity!r}, {self._combine!r})"


def _named(folded: Any, reply: Any) -> Any:
    raise AssertionError("a named reducer folds in Partial, not here")


publish(globals())
