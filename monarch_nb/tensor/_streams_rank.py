"""The rank side of streams: a table of tensors whose collectives may still be in flight.

A collective issued on a stream other than the main one starts asynchronously
(``async_op=True``) and the rank moves on to the next op; its output ref
settles (waits for the collective, then checks its failure flag) the first time
anything reads it, or when the controller drops the borrow it came through.
Each rank settles at the same point of the same op sequence, so no collective
is reordered between ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class RefTable(dict[int, Any]):
    """Ref id -> tensor (or DeferredError); ``waiting`` maps refs still in flight to
    the function that settles them (returns their final value)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[int, Callable[[], Any]] = {}

    def settle(self, ref: int) -> None:
        finish = self.waiting.pop(ref, None)
        if finish is not None:
            dict.__setitem__(self, ref, finish())

    def __getitem__(self, ref: int) -> Any:
        if self.waiting:
            self.settle(ref)
        return dict.__getitem__(self, ref)

    def get(self, ref: int, default: Any = None) -> Any:
        if self.waiting:
            self.settle(ref)
        return dict.get(self, ref, default)

    def pop(self, ref: int, *default: Any) -> Any:
        if self.waiting:
            self.settle(ref)
        return dict.pop(self, ref, *default)
