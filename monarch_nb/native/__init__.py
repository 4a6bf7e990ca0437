"""One-sided transfer of CPU memory between processes: the data plane of monarch_nb.

Layering: ``_memory`` (C: registration table, TCP server, copy engines) is
wrapped by ``_transport`` (connections, workers, transports, error
translation), which ``_buffer`` (RDMABuffer, RDMABatch: validation and
futures) builds on. This package imports nothing from monarch_nb except
``monarch_nb._model._future``, and nothing heavy: torch and numpy are recognised
only if the caller already imported them.

Importing it always works; if the C extension is missing, ``RDMABuffer(...)``
raises RDMAUnavailableError with the import error (see ``native_available()``).

Environment: ``MONARCH_NB_RDMA_TRANSPORT`` (auto | local | tcp),
``MONARCH_NB_RDMA_HOST`` / ``_PORT`` / ``_ADVERTISE`` (the owner's server),
``MONARCH_NB_RDMA_TCP_STREAMS`` (parallel connections per large copy) and
``MONARCH_NB_RDMA_TIMEOUT`` (seconds without progress before a copy fails).
"""

from monarch_nb.native._buffer import RDMAAction, RDMABatch, RDMABuffer, is_rdma_available
from monarch_nb.native._errors import (
    RDMAAccessError,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMATransferError,
    RDMAUnavailableError,
)
from monarch_nb.native._loader import native_available
from monarch_nb.native._transport import RDMAStatistics, start_server, statistics

for _obj in (RDMAStatistics, is_rdma_available, native_available, start_server, statistics):
    _obj.__module__ = __name__
del _obj

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
    "is_rdma_available",
    "native_available",
    "start_server",
    "statistics",
]
