"""Actors for the multi-host tests, importable by the agents' workers (by reference)."""

from __future__ import annotations

import time

from monarch_nb import Actor, current_rank, endpoint


class Leaf(Actor):
    @endpoint
    def who(self, x: int) -> tuple[int, int]:
        return current_rank().rank, x

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"


class Caller(Actor):
    def __init__(self, leaves) -> None:
        self.leaves = leaves

    @endpoint
    def call_all(self, x: int) -> list:
        return list(self.leaves.who.call(x).get(timeout=60).values())

    @endpoint
    def send_to(self, port) -> None:
        port.send(current_rank().rank)

    @endpoint
    def sleep_on(self, rank: int, seconds: float) -> str:
        return self.leaves.slice(hosts=rank).sleep.call_one(seconds).get(timeout=120)
