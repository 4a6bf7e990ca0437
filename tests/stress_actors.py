"""Actors for tests/test_calls.py, importable by workers by reference."""

from monarch_nb import Actor, endpoint


class Sink(Actor):
    @endpoint
    def take(self, i: int) -> int:
        return i
