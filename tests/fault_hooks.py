"""The client's ``unhandled_fault_hook``, recording what reaches it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import monarch_nb.actor
from monarch_nb import MeshFailure


class Faults:
    """An ``unhandled_fault_hook`` that keeps every failure it is given."""

    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []
        self.called = threading.Event()

    def __call__(self, failure: MeshFailure) -> None:
        self.failures.append(failure)
        self.called.set()

    def first_report(self, timeout: float) -> str:
        """The report of the first failure to reach the hook, waited for."""
        assert self.called.wait(timeout), "the unhandled failure never reached the client"
        return self.failures[0].report()


@contextmanager
def recording_faults() -> Iterator[Faults]:
    """A :class:`Faults` installed as the hook while the block runs (then the default)."""
    hook = Faults()
    monarch_nb.actor.unhandled_fault_hook = hook
    try:
        yield hook
    finally:
        monarch_nb.actor.unhandled_fault_hook = None
