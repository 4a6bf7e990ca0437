"""Monarch's ``monarch.rdma`` import path: ``from monarch_nb.rdma import RDMABuffer``.

The names of :mod:`monarch_nb.native` (where they are defined and documented),
plus Monarch's spellings of the same things:

- ``RDMAAction``: Monarch's batch of copies, ``read_remote(dst, src)`` and
  ``write_remote(dst, src)``, over our :class:`~monarch_nb.native.RDMABatch`;
- ``get_rdma_backend()``: ``"tcp"`` when the native data plane is built (it
  copies by cross-memory attach on one host and over TCP between hosts, never
  through ibverbs), else ``"none"``; ``is_ibverbs_available()`` is always False.

Differences a ported program meets: ``read_into`` / ``write_from`` take
``offset`` and ``size`` (bytes) instead of ``timeout=`` (a copy fails after
``MONARCH_NB_RDMA_TIMEOUT`` seconds without progress), their futures hold the
number of bytes copied, and ``drop()`` returns nothing. Monarch's
``fetch_add`` / ``compare_and_swap`` and its transfer warnings are not provided.
"""

from __future__ import annotations

from typing import Any

from .native import (
    RDMAAccessError,
    RDMABatch,
    RDMABuffer,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMAStatistics,
    RDMATransferError,
    RDMAUnavailableError,
    native_available,
    statistics,
)


class RDMAAction(RDMABatch):
    """Copies submitted together, in Monarch's words: one future for all of them.

    Example::

        action = RDMAAction().read_remote(local_a, buf_a).write_remote(buf_b, local_b)
        action.submit().get()
    """

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Add a copy of the whole of ``src`` (a buffer) into local memory ``dst``."""
        self.read_into(src, dst)
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Add a copy of local memory ``src`` into the whole of ``dst`` (a buffer)."""
        self.write_from(dst, src)
        return self


def get_rdma_backend() -> str:
    """``"tcp"`` if buffers can be made here (no ibverbs is ever used), else ``"none"``."""
    return "tcp" if native_available() else "none"


def is_ibverbs_available() -> bool:
    """False: monarch_nb copies by cross-memory attach and TCP, not ibverbs."""
    return False


def is_rdma_available() -> bool:
    """Whether :class:`RDMABuffer` works in this process (the native data plane is built).

    Monarch's deprecated function answers "is ibverbs available"; a program
    asking it wants to know whether it may use RDMABuffer, which this answers.
    """
    return native_available()


RDMAAction.__module__ = __name__
for _fn in (get_rdma_backend, is_ibverbs_available, is_rdma_available):
    _fn.__module__ = __name__
del _fn

__all__ = [
    "RDMAAccessError",
    "RDMAAction",
    "RDMABatch",
    "RDMABuffer",
    "RDMABufferDroppedError",
    "RDMAError",
    "RDMAOwnerGoneError",
    "RDMAStatistics",
    "RDMATransferError",
    "RDMAUnavailableError",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
    "native_available",
    "statistics",
]
