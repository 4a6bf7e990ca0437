"""Actors for tests/test_calls.py, importable by workers by reference."""

from monarch_nb import Actor, endpoint


class Sink(Actor):
    @endpoint
    def take(self, i: int) -> int:
        return i


class Gate(Actor):
    @endpoint
    def wait(self, path: str) -> str:
        """Return once ``path`` exists (a test opens the gate by creating it)."""
        import os
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "open"
