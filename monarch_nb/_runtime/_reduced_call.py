"""A call whose replies fold with a named reducer: one Partial, not a ValueMesh.

``Accumulator(ep, identity, "sum")`` sends one (see :mod:`.._model._reducers`).
Its replies come as ranks' own replies (one host, or a reply an agent could
not fold) or as an agent's partial fold of a subtree (``add_fold``); both fold
into one :class:`~.._model._reducers.Partial` with the same code, so the
answer and the errors do not depend on where the folding happened. Failures
are never folded away: each failing rank's failure is kept, and the call fails
with them all, as ``call()`` does (without the other ranks' values, which
were folded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._model._errors import RemoteError, RemoteFailure
from .._model._public import publish
from .._model._reducers import Partial
from .._model._shape import Shape
from ._pending import PendingCall

FOLD_PREFIX = "fold:"  # collect="fold:sum": what EndpointBase._send is asked for


class ReducedCall(PendingCall):
    """A :class:`PendingCall` folding its replies with ``reducer``."""

    __slots__ = ("covers", "partial", "reducer")

    def __init__(
        self,
        call_id: int,
        shape: Shape,
        reducer: str,
        *,
        actor: str,
        endpoint: str = "",
        error_class: type[RemoteError] = RemoteError,
    ) -> None:
        super().__init__(
            call_id, shape, actor=actor, endpoint=endpoint, collect="fold",
            error_class=error_class,
        )  # fmt: skip
        self.reducer = reducer
        self.partial = Partial(reducer)
        # agent identity -> the ranks its partial fold covers (set when sent
        # down a tree; empty: every reply comes on its own)
        self.covers: dict[bytes, tuple[int, ...]] = {}

    # -- replies (the receiving thread) ------------------------------------------------

    def add_value(self, rank: int, value: Any) -> None:
        if rank in self.answered:
            return
        error = self.partial.add(rank, value)
        if error is not None:
            self.add_failure(RemoteFailure(rank, "TypeError", error, ""))
            return
        self._arrived += 1
        self._answer(rank)
        self._maybe_finish()

    def add_fold(
        self, agent: bytes, partial: Partial, passed: Sequence[int], lost: Sequence[int]
    ) -> str | None:
        """Agent ``agent``'s fold of its subtree: all its ranks but ``passed`` (their
        replies come on their own) and ``lost`` (exited: the call fails with
        that). What was wrong with it, or None."""
        covered = self.covers.pop(agent, None)
        if covered is None:
            return "a fold this call did not ask of it"
        apart = set(passed).union(lost)
        if not apart.issubset(covered) or partial.reducer != self.reducer:
            return "a fold of ranks or a reducer this call did not ask of it"
        if partial.count != len(covered) - len(apart):
            return f"a fold of {partial.count} replies, for {len(covered) - len(apart)} ranks"
        self.partial.merge(partial)
        folded = [r for r in covered if r not in apart] if apart else covered
        self._arrived += len(folded)
        bulk = getattr(self.tracker, "ranks_answered", None)
        if bulk is not None:  # the controller: one step for the subtree
            bulk(self, folded)
        else:
            for rank in folded:
                self._answer(rank)
        self._maybe_finish()
        return None

    def _collected(self) -> Partial:
        return self.partial  # the caller folds its identity in (Partial.finish)


publish(globals())
