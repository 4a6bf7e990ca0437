"""The controller's bookkeeping for a subtree's fold: many ranks answered in one step.

A reduced call's fold (``_tree_reduce``) answers every rank below a subtree
root at once; :meth:`FoldAnswers.ranks_answered` does for them what
``Controller.rank_answered`` does for one (answered, load, timeline, idle
events) under one lock, so the controller's cost per rank of a fold is a few
dict operations, not a reply read. The controller is this mixin's only user.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._runtime._pending import PendingCall


class FoldAnswers:
    """``ranks_answered``: the part of :class:`~._client.Controller` folds use."""

    _lock: threading.Lock

    def _unload(self, call: PendingCall, rank: int) -> bool:
        raise NotImplementedError

    def ranks_answered(self, call: PendingCall, ranks: Sequence[int]) -> None:
        """Each of ``ranks`` answered ``call`` (with a value folded on the way)."""
        with self._lock:
            if call.closed:
                return
            answered = call.answered
            if not isinstance(answered, set):
                answered = call.answered = set(answered)
            fresh = [r for r in ranks if r not in answered]
            answered.update(fresh)
            idle = [r for r in fresh if self._unload(call, r)]
            group: Any = call.group
            if group is not None:
                record = group.timeline.answered
                for rank in fresh:
                    record(call.call_id, rank, None)
        if idle and group is not None and group.events.calls_observed:
            for rank in idle:
                group.rank_settled(rank)
