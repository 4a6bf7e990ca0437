"""The picklable description of a registered buffer, and this host's identity."""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Handle:
    """Everything a reader needs to reach a registered region.

    ``token`` is the capability: whoever holds the handle may read, write and
    drop the region, nobody else. It is left out of ``repr`` so handles can be
    logged, and so is ``address`` (a pointer in the owner: an ASLR leak).
    """

    host_key: str
    hostname: str
    pid: int
    region: int
    address: int = field(repr=False)
    size: int
    dtype: str | None
    shape: tuple[int, ...]
    writable: bool
    server: tuple[str, int]
    token: bytes = field(repr=False)
    #: The owner's CUDA device holding the region, -1 for host memory.
    device: int = -1
    #: A CUDA region's IPC handle and the region's offset in that allocation
    #: (None: not exportable, e.g. expandable segments; readers then go by TCP).
    ipc: tuple[bytes, int] | None = field(default=None, repr=False)
    #: The owner's Unix socket (in its tree's private directory), for readers on
    #: its host; None: TCP only.
    unix: str | None = field(default=None, repr=False)
    #: Copies that cross the network are sealed (AES-256-GCM), by the owner's choice.
    sealed: bool = False

    def describe(self) -> str:
        """Name the buffer and its owner for error messages."""
        host, port = self.server
        where = f" on cuda:{self.device}" if self.device >= 0 else ""
        return (
            f"buffer #{self.region} ({self.size} bytes, {layout(self.dtype, self.shape)}{where}) "
            f"owned by pid {self.pid} on {self.hostname} (server {host}:{port})"
        )


def layout(dtype: str | None, shape: tuple[int, ...]) -> str:
    """``float32[4, 8]`` for typed memory, ``bytes`` for untyped memory."""
    if dtype is None:
        return "bytes"
    return f"{dtype}[{', '.join(map(str, shape))}]"


@functools.cache
def host_key() -> str:
    """Identify this kernel, pid and network namespace: equal keys mean one host.

    Two processes may use the cross-memory (local) transport only if they see
    the same pids, i.e. they run on the same booted kernel in the same pid
    namespace. The hostname alone is not enough (containers copy it). A
    separate network namespace counts as another host too: that is how hosts
    are made on one machine in tests, and such peers are reached over TCP.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.readlink("/proc/self/ns/pid")
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        return f"host:{socket.gethostname()}:unknown"
    return f"{boot}/{pidns}/{netns}"
