"""An agent's part in a reduced call: fold its ranks' replies and its children's
partial folds, and send one partial up (see :mod:`.._wire._tree_fold`).

The agent checks a worker's reply before it reads it: the HMAC of the worker's
mesh key (which the agent was given to start the worker) and a replay window of
its own. It reads the value of a ``Value`` reply only with an unpickler that
refuses every class and function (:func:`~.._wire._tree_fold.plain_payload`),
and folds it only if the reducer takes it (numbers; str and None for
``"equal"``). Everything else (a failure, a tensor, a NumPy scalar, any other
object) goes up unchanged, as every reply did before, and the controller
folds it with the same code (:class:`~.._model._reducers.Partial`): the answer
and the errors are those of one host.

A fold whose child agent died never completes here; the controller fails its
call (the lost relay's ranks, ``_controller._agent_tree``), and the oldest
folds are forgotten past :data:`_MAX_FOLDS` in flight.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._model._reducers import REDUCERS, Partial
from .._wire._messages import Failure, Message, UnknownMessage, Value
from .._wire._signed import ReplayWindow, Signer, WireStats, sender_tag
from .._wire._tree_fold import NOT_PLAIN, FoldedReply, Plan, plain_payload, up_frame

_log = logging.getLogger("monarch_nb.agent")
_MAX_FOLDS = 4096  # reduced calls in flight through one agent, at most


@dataclass
class _Fold:
    call_id: int
    partial: Partial
    parent: bytes | None  # the parent agent's routing id on the tree link; None: the controller
    workers: dict[bytes, int]  # identity -> rank, still to reply
    children: set[bytes]  # tree endpoints still to send their partial
    passed: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)


@dataclass
class _Worker:
    signer: Signer
    tag: bytes
    window: ReplayWindow = field(default_factory=ReplayWindow)
    calls: set[int] = field(default_factory=set)  # folds waiting on its reply


class Folds:
    """The reduced calls in flight through this agent."""

    def __init__(
        self,
        send_own: Callable[[Message], None],
        send_to_parent: Callable[[bytes, list[bytes]], None],
    ) -> None:
        self._send_own = send_own
        self._send_to_parent = send_to_parent
        self.stats = WireStats()  # the workers' replies checked here
        self._workers: dict[bytes, _Worker] = {}
        self._folds: dict[int, _Fold] = {}
        self.waiting = 0  # workers' replies awaited (0: nothing to look at)
        self.dropped = 0  # partials from children that were not one

    def watch(self, identity: bytes, key_hex: str | None) -> None:
        """A worker started with ``key_hex`` (its mesh's key, from its bootstrap)."""
        if not key_hex:
            return
        signer = Signer(
            bytes.fromhex(key_hex), self.stats, sender=sender_tag(b"agent"), upstream=False,
            trusted_link=True,
        )  # fmt: skip
        self._workers[identity] = _Worker(signer, sender_tag(identity))

    def forget(self, identity: bytes) -> None:
        """The worker exited: the folds waiting on it count it as lost."""
        worker = self._workers.pop(identity, None)
        if worker is None:
            return
        for call_id in worker.calls:
            fold = self._folds.get(call_id)
            if fold is not None and identity in fold.workers:
                fold.lost.append(fold.workers.pop(identity))
                self.waiting -= 1
                self._maybe_done(fold)

    def begin(self, plan: Plan, parent: bytes | None) -> None:
        """A reduced cast passes through: what to wait for (before it is relayed)."""
        if plan.reducer >= len(REDUCERS):
            raise ValueError(f"reducer {plan.reducer} is not one of {len(REDUCERS)}")
        if len(self._folds) >= _MAX_FOLDS:  # dict order: the oldest first
            stale = next(iter(self._folds))
            _log.warning("monarch_nb agent: forgot reduced call %d (too many in flight)", stale)
            self._drop(self._folds[stale])
        fold = _Fold(
            plan.call_id,
            Partial(REDUCERS[plan.reducer]),
            parent,
            {},
            {endpoint for endpoint, _ in plan.children},
        )
        self._folds[plan.call_id] = fold
        for rank, identity in plan.workers:
            worker = self._workers.get(identity)
            if worker is None:  # exited already (its exit was reported)
                fold.lost.append(rank)
                continue
            fold.workers[identity] = rank
            worker.calls.add(plan.call_id)
            self.waiting += 1
        self._maybe_done(fold)

    def from_worker(self, identity: bytes, frames: list[Any]) -> bool:
        """A message from worker ``identity``: True if it was a reply folded here
        (consumed), False to send it up unchanged."""
        worker = self._workers.get(identity)
        if worker is None or not worker.calls:
            return False
        try:
            message = worker.signer.verify(frames, worker.window, sender=worker.tag)
        except UnknownMessage:
            return False
        if not isinstance(message, Value | Failure) or message.call_id not in worker.calls:
            return False
        fold = self._folds[message.call_id]
        worker.calls.discard(message.call_id)
        rank = fold.workers.pop(identity)
        self.waiting -= 1
        folded = False
        if isinstance(message, Value):
            value = plain_payload(frames)
            folded = value is not NOT_PLAIN and fold.partial.add(rank, value) is None
        if not folded:  # the controller reads it, as any reply (and folds it, or fails)
            fold.passed.append(rank)
        self._maybe_done(fold)
        return folded

    def from_child(self, endpoint: bytes, call_id: int, frames: list[Any]) -> None:
        """Child agent ``endpoint``'s partial fold of call ``call_id``."""
        fold = self._folds.get(call_id)
        if fold is None or endpoint not in fold.children:
            return  # forgotten, or not asked of it
        try:
            if len(frames) != 2:
                raise ValueError(f"{len(frames)} frames")
            partial = Partial.from_json(frames[0])
            passed, lost = json.loads(bytes(frames[1]))
            if not all(type(r) is int for r in [*passed, *lost]):
                raise ValueError("ranks that are not ints")
            fold.partial.merge(partial)
        except (ValueError, TypeError) as exc:
            self.dropped += 1
            _log.error("monarch_nb agent: a child's partial fold of call %d: %s", call_id, exc)
            return
        fold.children.discard(endpoint)
        fold.passed += passed
        fold.lost += lost
        self._maybe_done(fold)

    def _maybe_done(self, fold: _Fold) -> None:
        if fold.workers or fold.children:
            return
        del self._folds[fold.call_id]
        data = fold.partial.to_json()
        if fold.parent is None:
            self._send_own(FoldedReply(fold.call_id, data, tuple(fold.passed), tuple(fold.lost)))
        else:
            ranks = json.dumps([fold.passed, fold.lost]).encode()
            self._send_to_parent(fold.parent, [up_frame(fold.call_id), data, ranks])

    def _drop(self, fold: _Fold) -> None:
        self._folds.pop(fold.call_id, None)
        for identity in fold.workers:
            worker = self._workers.get(identity)
            if worker is not None:
                worker.calls.discard(fold.call_id)
                self.waiting -= 1

    def clear(self) -> None:
        """The controller left: nothing in flight is owed to anyone."""
        for fold in list(self._folds.values()):
            self._drop(fold)
        self.waiting = 0
