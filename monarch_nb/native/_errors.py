"""Errors of the data plane.

::

    RDMAError (MonarchNbError, RuntimeError)   anything the data plane could not do
    ├── RDMAUnavailableError              the C extension is missing or failed to import
    ├── RDMAAccessError                   the owner refused: wrong token, read-only region
    ├── RDMABufferDroppedError            the buffer was dropped (before or during the copy)
    ├── RDMAOwnerGoneError                the owning process exited or cannot be reached
    └── RDMATransferError                 the copy broke for another reason (I/O, protocol)

Misuse found before any byte moves is reported with the built-in types:
``TypeError`` (unsupported object, dtype mismatch) and ``ValueError`` (sizes,
offsets, non-contiguous memory, CPU-only build).
"""

from __future__ import annotations

from .._model._errors import MonarchNbError


class RDMAError(MonarchNbError, RuntimeError):
    """A data-plane operation failed; ``handle`` names the buffer when known."""

    def __init__(self, message: str, *, handle: object | None = None) -> None:
        super().__init__(message)
        self.handle = handle


class RDMAUnavailableError(RDMAError):
    """The native extension is not available in this installation."""


class RDMAAccessError(RDMAError):
    """The owner refused the request: the capability token does not match, or
    the region is read-only."""


class RDMABufferDroppedError(RDMAError):
    """The buffer was dropped by its owner (or a holder of its handle)."""


class RDMAOwnerGoneError(RDMAError):
    """The process that owns the buffer has exited or cannot be reached."""


class RDMATransferError(RDMAError):
    """The copy failed for a reason other than the ones above."""


for _cls in (
    RDMAError,
    RDMAUnavailableError,
    RDMAAccessError,
    RDMABufferDroppedError,
    RDMAOwnerGoneError,
    RDMATransferError,
):
    _cls.__module__ = "monarch_nb.native"
