"""Actors of the hardening suite, imported by workers by reference (no torch at import)."""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

from monarch_nb import Actor, current_rank, endpoint


def refuse_to_unpickle(reason: str) -> Any:
    """Called by pickle when rebuilding an :class:`UnpicklableThere`: always fails."""
    raise RuntimeError(f"refusing to unpickle: {reason}")


class UnpicklableThere:
    """Pickles fine, but raises when unpickled (on whichever side receives it)."""

    def __reduce__(self) -> Any:
        return (refuse_to_unpickle, ("by design",))


class Probe(Actor):
    """Small endpoints to call while ranks are killed, stopped or flooded."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def length(self, x: Any) -> int:
        return len(x)

    @endpoint
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return current_rank().rank

    @endpoint
    def flood(self, lines: int) -> int:
        write = sys.stdout.write
        for i in range(lines):
            write(f"line {i} of rank {current_rank().rank}\n")
        sys.stdout.flush()
        return lines

    @endpoint
    def bad_return(self) -> Any:
        return UnpicklableThere()

    @endpoint
    def allocate_under_limit(self, limit_bytes: int, want_bytes: int) -> int:
        """Cap this rank's address space at current + ``limit_bytes``, then try to
        allocate ``want_bytes``: MemoryError, like a rank running out of memory."""
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as statm:
            current = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (current + limit_bytes, hard))
        try:
            return len(bytearray(want_bytes))
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

    @endpoint
    def rdma_region(self, size: int) -> Any:
        from monarch_nb.native import RDMABuffer

        self.memory = bytearray(os.urandom(size))
        self.buffer = RDMABuffer(self.memory)  # kept: dropping it revokes the handle
        return self.buffer


class Collective(Actor):
    """A gloo process group over the mesh (imports torch when spawned)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")

    @endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        x = torch.tensor([value])
        dist.all_reduce(x)
        return float(x.item())

    @endpoint
    def pid(self) -> int:
        return os.getpid()


# Canaries: unpickling one calls trip(), so a test can tell whether a frame was
# ever unpickled in this process.
TRIPPED: list[str] = []


def trip(tag: str) -> str:
    TRIPPED.append(tag)
    return tag


class Canary:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __reduce__(self) -> Any:
        return (trip, (self.tag,))
