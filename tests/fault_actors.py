"""Actors for the partial-failure and restart tests (imported by reference)."""

from __future__ import annotations

import os
import time

from monarch_nb import Actor, current_rank, endpoint


class Keeper(Actor):
    """Holds a value per rank, to show which ranks kept their state."""

    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.rank = current_rank().rank

    @endpoint
    def put(self, value: int) -> None:
        self.value = value

    @endpoint
    def get(self) -> tuple[int, int]:
        return self.rank, self.value

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank
