"""Actors for tests/test_worker.py, importable by workers by reference."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from monarch_nb import Actor, endpoint


class Sleeper(Actor):
    def __init__(self) -> None:
        self.log: list[str] = []

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    @endpoint
    def take(self, value: object) -> object:
        return value


class AsyncSleeper(Actor):
    """Sleeper's async twin (an actor's endpoints are all def or all async def)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    @endpoint
    async def slow(self) -> None:
        print("slow started", flush=True)
        try:
            await asyncio.sleep(30)
        finally:
            self.log.append("slow unwound")
        self.log.append("slow resumed after its interrupt")

    @endpoint
    async def other(self) -> list[str]:
        await asyncio.sleep(0.05)
        return list(self.log)


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class Raiser(Actor):
    @endpoint
    def boom(self) -> None:
        raise BrokenStr()


class LookupRaiser(Actor):
    """An actor whose own attribute lookup raises for one endpoint."""

    @endpoint
    def guarded(self) -> int:
        return 1

    @endpoint
    def fine(self) -> int:
        return 2

    def __getattribute__(self, name: str):
        if name == "guarded":
            raise RuntimeError("looking up guarded failed")
        return super().__getattribute__(name)


class Unpicklable:
    """Pickles on the controller, fails to unpickle on a rank."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise RuntimeError("cannot be rebuilt here")


class WireWatcher(Actor):
    """Where a rank's wire thread is, so a test can count its wake-ups."""

    @endpoint
    def wire_thread(self) -> tuple[int, int]:
        (wire,) = [t for t in threading.enumerate() if t.name == "monarch_nb-wire"]
        return os.getpid(), wire.native_id

    @endpoint
    def noop(self) -> None:
        return None

    @endpoint
    def echo(self, value: int) -> int:
        return value


class SlowSampler(Actor):
    """A rank whose heartbeat reads its resources slowly, as a loaded host does (a
    file read lets the main thread run meanwhile)."""

    @endpoint
    def slow_samples(self, delay: float) -> None:
        from monarch_nb._worker import _resources

        real = _resources.sample

        def slow() -> object:
            sample = real()
            time.sleep(delay)
            return sample

        _resources.sample = slow

    @endpoint
    def work(self, seconds: float) -> None:
        time.sleep(seconds)
