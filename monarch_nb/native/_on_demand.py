"""A copy's future that starts its copy when first waited on, as Monarch's.

Monarch's futures run their work when first awaited (or ``get()``), so a
program may issue a read and a write of one buffer and fix their order by
the order it awaits them: ``r = buf.read_into(a); w = buf.write_from(b);
await w; await r`` reads what it wrote. Started at once, the two would race.

So ``read_into``, ``write_from`` and ``RDMAAction.submit`` return an
:class:`OnDemand` future. Arguments are still checked at the call (errors
raise there); the copy starts at the first ``get()``, ``result()``,
``exception()``, ``await``, ``as_asyncio()`` or ``add_done_callback()``, and
its ``timeout=`` counts from then. A future nobody keeps (``buf.write_from(x)``
as a statement) starts its copy when it is let go, so a copy asked for is
never lost; ``done()`` does not start it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import Any

from monarch_nb._model._future import Future


class OnDemand(Future[int]):
    """A future of the bytes copied, whose copy ``start()`` begins on first wait."""

    __slots__ = ("_start", "_start_lock")

    def __init__(self, start: Callable[[], Future[int]]) -> None:
        super().__init__()
        self._start: Callable[[], Future[int]] | None = start
        self._start_lock = threading.Lock()

    def _take_start(self) -> Callable[[], Future[int]] | None:
        if self._start is None:
            return None
        with self._start_lock:
            start, self._start = self._start, None
        return start

    def _begin(self) -> None:
        start = self._take_start()
        if start is None:
            return
        try:
            inner = start()
        except BaseException as exc:
            self.set_exception(exc)
            return
        inner.add_done_callback(self._settle)

    def _settle(self, inner: Future[int]) -> None:
        error = inner.exception(timeout=0)
        if error is not None:
            self.set_exception(error)
        else:
            self.set_result(inner.get(timeout=0))

    def _wait(self, timeout: float | None) -> bool:
        self._begin()
        return super()._wait(timeout)

    def add_done_callback(self, callback: Callable[[Future[int]], None]) -> None:
        self._begin()
        super().add_done_callback(callback)

    def __await__(self) -> Generator[Any, None, int]:
        self._begin()
        return (yield from super().__await__())

    def __del__(self) -> None:
        # Let go unwaited: run the copy anyway (nobody will read its result).
        start = self._take_start()
        if start is not None:
            try:
                start()
            except BaseException:
                pass  # its error had nobody to go to, as an unread future's
