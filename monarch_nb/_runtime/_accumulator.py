"""``Accumulator``: call an endpoint on every actor of a mesh and fold the replies.

``Accumulator(counters.value, 0, operator.add).accumulate()`` is a future of
``0 + v0 + v1 + ...``, one ``v`` per actor the endpoint's mesh (or slice)
holds, as Monarch's ``Accumulator``. The replies are folded in rank order once
all have come, so a ``combine`` that is not commutative still gives one answer;
the first failing rank fails the future, as ``call()`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .._model._errors import MeshUsageError
from .._model._future import Future, completed, failed
from .._model._public import publish
from .._model._value_mesh import ValueMesh
from ._endpoint import EndpointBase

R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[R, A]):
    """Fold the replies of one endpoint's every actor into one value.

    Args:
        endpoint: an endpoint of an actor mesh (``actors.value``, not the
            class's ``Counter.value``); a slice's endpoint folds that slice.
        identity: the value before the first reply.
        combine: ``combine(folded, reply)``, the new folded value.

    Example::

        total = Accumulator(counters.value, 0, operator.add).accumulate().get()
    """

    def __init__(self, endpoint: EndpointBase[R], identity: A, combine: Callable[[A, R], A]):
        if not callable(combine):
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
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Call the endpoint with ``args`` on every actor; a future of the folded replies.

        ``await`` it or ``.get()`` it. It fails with the call's error if a rank
        fails, or with what ``combine`` raised.
        """
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


publish(globals())
