"""Monarch's ``monarch.rdma`` import path: ``from monarch_nb.rdma import RDMABuffer``.

The names of :mod:`monarch_nb.native` (where they are defined and documented),
plus Monarch's spellings of the same things:

- ``RDMAAction`` (defined in :mod:`monarch_nb.native`): Monarch's batch of
  copies, ``read_remote(dst, src)``, ``write_remote(dst, src)``,
  ``submit(timeout=)``, over our :class:`~monarch_nb.native.RDMABatch`;
- ``is_rdma_available()``: whether :class:`RDMABuffer` works here (Monarch's
  asks "is ibverbs there"; a program asking wants to know whether it may use
  RDMABuffer, which this answers);
- ``get_rdma_backend()``: ``"tcp"`` when the native data plane is built (it
  copies by cross-memory attach on one host and over TCP between hosts, never
  through ibverbs), else ``"none"``; ``is_ibverbs_available()`` is always False.

Differences a ported program meets: ``read_into`` / ``write_from`` also take
``offset`` and ``size`` (bytes) beside ``timeout=``, and their futures hold the
number of bytes copied. Monarch's ``fetch_add`` / ``compare_and_swap`` and its
transfer warnings are not provided.
"""

from __future__ import annotations

from .native import (
    RDMAAccessError,
    RDMAAction,
    RDMABatch,
    RDMABuffer,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMAStatistics,
    RDMATransferError,
    RDMAUnavailableError,
    is_rdma_available,
    native_available,
    statistics,
)


def get_rdma_backend() -> str:
    """``"tcp"`` if buffers can be made here (no ibverbs is ever used), else ``"none"``."""
    return "tcp" if native_available() else "none"


def is_ibverbs_available() -> bool:
    """False: monarch_nb copies by cross-memory attach and TCP, not ibverbs."""
    return False


for _fn in (get_rdma_backend, is_ibverbs_available):
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
