"""RDMABuffer: register local memory once, copy to and from it from any process.

The owner wraps a contiguous CPU tensor, ndarray, bytearray or writable
memoryview; nothing is copied. The buffer pickles to a small handle (owner
host and pid, region id, address, size, dtype and shape, a random 128-bit
capability token, the owner's server address) that any process can use::

    buf = RDMABuffer(weights)                  # in the owner
    ...                                        # pickle buf to a reader
    buf.read_into(local).get()                 # in the reader: owner's Python not involved
    buf.write_from(update, offset=64).get()

Drop safety
-----------
Memory may be freed by its owner only once no other process can still touch
it, and a copy must never report success for a dropped buffer. Both
transports go through the owner's native registration table, guarded by one
mutex:

* every owner-side access is preceded by a lookup that checks the region is
  registered and not revoked, the token matches and the range is inside it;
  the lookup counts a *use* of the region for the duration of the access;
* ``drop()`` (or garbage collection of the owner's RDMABuffer) marks the region
  revoked, so new requests are refused, wakes every connection that is using
  it, and waits until the use count is zero before the memory is released;
* the TCP transport accesses memory only on the owner's server threads
  (send/recv straight from/into the region); waking them is ``shutdown()`` of
  their socket, so the stream breaks at once and the reader sees a short
  transfer;
* the local transport is a *lease*: the reader asks the owner's server for
  the region (the reply carries the region's real address, so a forged handle
  cannot aim elsewhere), copies with process_vm_readv/writev in 16 MiB chunks
  (large copies on a few threads) and then releases the lease. Revocation
  half-closes the lease connection; the reader polls it between chunks, stops
  every thread, and only then releases. The owner counts
  the use until that release arrives (or the reader's socket closes because
  it died), so the copy is over before drop() returns;
* a copy succeeds only if its lease or stream ended normally; a read that
  raced a drop therefore fails with RDMABufferDroppedError rather than return
  bytes that may belong to freed memory.

If a reader stops responding while holding a lease (e.g. SIGSTOP), drop()
gives up after ``DROP_TIMEOUT_S`` and keeps the memory alive for the rest of
the process instead of freeing it under that reader.

Lifetime
--------
As in Monarch, a registration lasts until ``drop()`` or the owner process
exits (``lifetime="process"``, the default): the owner keeps a reference to
the memory, so an endpoint may build a buffer and return it inline
(``return RDMABuffer(self.weights)``) and the handle stays readable after the
endpoint's own object is gone. ``lifetime="object"`` revokes the region when
the owner's RDMABuffer object is garbage collected instead (and keeps no
reference to the memory beyond it).
"""

from __future__ import annotations

import functools
import logging
import operator
import os
import secrets
import socket
import threading
import weakref
from typing import Any

from monarch_nb._model._future import Future
from monarch_nb.native import _cudart, _sealing
from monarch_nb.native._errors import RDMAAccessError, RDMABufferDroppedError, RDMATransferError
from monarch_nb.native._handle import Handle, host_key, layout
from monarch_nb.native._loader import load_extension
from monarch_nb.native._memoryref import describe
from monarch_nb.native._on_demand import OnDemand
from monarch_nb.native._transport import (
    CopyOp,
    local_socket,
    request,
    resolve_transport,
    start_server,
    submit,
)

DROP_TIMEOUT_S = 30.0

log = logging.getLogger("monarch_nb.native")

# Memory whose drop timed out: never freed, because a reader may still copy.
_kept_alive: list[Any] = []
_kept_alive_lock = threading.Lock()
# lifetime="process": region -> the memory it keeps alive, until drop().
_registered: dict[int, Any] = {}

LIFETIMES = ("process", "object")


class _Size(int):
    """A byte count that is also callable: ``buf.size`` (ours) and ``buf.size()``
    (Monarch's) both work."""

    def __call__(self) -> int:
        return int(self)


def _release_registered(region: int) -> None:
    with _kept_alive_lock:
        keepalive = _registered.pop(region, _MISSING)
    if keepalive is not _MISSING:
        _unregister(region, keepalive)


_MISSING = object()


def _unregister(region: int, keepalive: Any) -> None:
    left = load_extension().unregister(region, DROP_TIMEOUT_S)
    if left:
        log.warning(
            "buffer #%d: %d reader(s) still copied after %.0f s; its memory is kept alive",
            region,
            left,
            DROP_TIMEOUT_S,
        )
        with _kept_alive_lock:
            _kept_alive.append(keepalive)


class RDMABuffer:
    """A registered region of memory that other processes can read and write.

    Args:
        obj: a contiguous ``torch.Tensor`` on the CPU or a CUDA device (any dtype or
            shape), a C-contiguous ``numpy.ndarray``, a ``bytearray`` or a writable
            ``memoryview``; read-only buffers (``bytes``) are registered read-only.
            A CUDA tensor is read and written by CUDA IPC from processes on its host
            that use CUDA, through page-locked staging in the owner otherwise (other
            hosts, CPU-only readers); copies see the work queued on its device
            before they start.

        lifetime: ``"process"`` (the default, as Monarch): the region stays
            registered until ``drop()`` or the owner process exits, whatever
            happens to this object; ``"object"``: it is unregistered when this
            object is garbage collected too.

        encrypt: seal every copy that crosses the network (AES-256-GCM under a
            key of the connection's, made from the token): the owner refuses
            plain copies of it from other hosts. Copies on the owner's host (its
            Unix socket, cross-memory attach, CUDA IPC) are never sealed. Default:
            ``MONARCH_NB_RDMA_ENCRYPT`` (``1`` seals every buffer); a reader that
            sets it seals its own copies of any buffer.

    Raises:
        RDMAUnavailableError: the C extension could not be imported.
        TypeError / ValueError: ``obj`` is not contiguous CPU memory.

    Example::

        buf = RDMABuffer(torch.zeros(1024))
        other_process(buf)                     # pickles to a handle
        buf.read_into(dst).get()               # anywhere the handle went
    """

    def __init__(self, obj: Any, *, lifetime: str = "process", encrypt: bool | None = None) -> None:
        if lifetime not in LIFETIMES:
            raise ValueError(
                f"RDMABuffer(..., lifetime={lifetime!r}): use 'process' (until drop() or "
                "the process exits) or 'object' (until this object is garbage collected)"
            )
        memory = load_extension()
        ref = describe(obj, "the registered object", need_writable=False)
        ipc = None
        if ref.device >= 0:
            memory = _cudart.load()
            exported, code = memory.cuda_ipc_export(ref.device, ref.address)
            ipc = exported  # None: readers on this host go by TCP as well
            if exported is None:
                log.debug("no CUDA IPC handle (%s): TCP only", memory.cuda_error(code))
        sealed = _sealing.wanted(encrypt)
        if sealed:
            _sealing.load()
        server = start_server()
        token = secrets.token_bytes(memory.TOKEN_SIZE)
        region = memory.register(ref.address, ref.nbytes, token, ref.writable, ref.device, sealed)
        self._handle = Handle(
            host_key=host_key(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            region=region,
            address=ref.address,
            size=ref.nbytes,
            dtype=ref.dtype,
            shape=ref.shape,
            writable=ref.writable,
            server=server,
            token=token,
            device=ref.device,
            ipc=ipc,
            unix=local_socket(),
            sealed=sealed,
        )
        self._dropped = False
        self._release: Any = None  # in the owner: what unregisters the region
        if lifetime == "process":
            with _kept_alive_lock:
                _registered[region] = ref.keepalive
            self._release = functools.partial(_release_registered, region)
        else:
            # The finalizer holds the memory: it outlives this object until unregistered.
            finalizer = weakref.finalize(self, _unregister, region, ref.keepalive)
            finalizer.atexit = False
            self._release = finalizer

    @classmethod
    def _from_handle(cls, handle: Handle) -> RDMABuffer:
        self = cls.__new__(cls)
        self._handle = handle
        self._dropped = False
        self._release = None
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._handle,))

    # -- description -----------------------------------------------------------

    @property
    def size(self) -> _Size:
        """Size of the registered region in bytes (``buf.size`` or ``buf.size()``)."""
        return _Size(self._handle.size)

    @property
    def dtype(self) -> str | None:
        """Element type (``"float32"``, ``"bfloat16"``...), or None for untyped bytes."""
        return self._handle.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the registered tensor or array (``(size,)`` for bytes)."""
        return self._handle.shape

    @property
    def owner_pid(self) -> int:
        """Process id of the owner."""
        return self._handle.pid

    @property
    def is_owner(self) -> bool:
        """True in the process (and on the object) that registered the memory."""
        return self._release is not None

    @property
    def dropped(self) -> bool:
        """True once ``drop()`` was called on this object."""
        return self._dropped

    def __repr__(self) -> str:
        h = self._handle
        state = " dropped" if self._dropped else ""
        return (
            f"<RDMABuffer{state} {h.size} bytes {layout(h.dtype, h.shape)} "
            f"owned by pid {h.pid} on {h.hostname}>"
        )

    # -- copies ----------------------------------------------------------------

    def read_into(
        self,
        dst: Any,
        offset: int | None = None,
        size: int | None = None,
        *,
        transport: str | None = None,
        timeout: float | None = None,
    ) -> Future[int]:
        """Copy ``size`` bytes from ``offset`` in this buffer to the start of ``dst``.

        With neither ``offset`` nor ``size``, the whole buffer is copied and
        ``dst`` must be at least its size (as Monarch); with either (``offset=0`` too),
        ``size`` defaults to ``dst``'s size. Offsets
        and sizes are in bytes. Typed memory (tensors, arrays) must have the
        buffer's dtype; bytearrays and memoryviews match any dtype.

        Returns a future of the number of bytes copied. Errors in the arguments
        raise at once (before any byte moves); failures of the copy (dropped
        buffer, owner gone, bad token) arrive through the future. As Monarch's,
        the copy starts when the future is first waited on (``get``, ``await``,
        a done-callback) or let go, so the order of awaits orders copies issued
        together (see :mod:`monarch_nb.native._on_demand`). ``timeout``
        (seconds, counted from that start) fails the future with
        RDMATransferError if the copy has not finished by then (the copy itself
        stops at its own progress timeout).
        """
        op = self._plan(dst, offset, size, write=False, transport=transport)
        return OnDemand(lambda: _with_timeout(submit([op]), timeout, "read"))

    def write_from(
        self,
        src: Any,
        offset: int | None = None,
        size: int | None = None,
        *,
        transport: str | None = None,
        timeout: float | None = None,
    ) -> Future[int]:
        """Copy ``size`` bytes from the start of ``src`` into this buffer at ``offset``.

        Sizes, offsets, dtypes and ``timeout`` follow the rules of ``read_into``;
        with neither ``offset`` nor ``size``, ``src`` may be smaller than the
        buffer (it is written at its start, as Monarch).
        """
        op = self._plan(src, offset, size, write=True, transport=transport)
        return OnDemand(lambda: _with_timeout(submit([op]), timeout, "write"))

    def _plan(
        self,
        local: Any,
        offset: int | None,
        size: int | None,
        *,
        write: bool,
        transport: str | None,
        raw: bool = False,
    ) -> CopyOp:
        h = self._handle
        if self._dropped:
            raise RDMABufferDroppedError(
                f"{h.describe()} was dropped; ask its owner for a new handle", handle=h
            )
        role = "the source" if write else "the destination"
        ref = describe(local, role, need_writable=not write)
        whole = offset is None and size is None
        offset = 0 if offset is None else operator.index(offset)
        # ``raw``: Monarch's RDMAAction copies bytes whatever the dtypes (a uint8
        # view of a float32 buffer is a common way to ship it); only sizes count.
        if not raw and h.dtype is not None and ref.dtype is not None and h.dtype != ref.dtype:
            raise TypeError(
                f"dtype mismatch: the buffer holds {h.dtype} but {role} is {ref.dtype} "
                f"({layout(ref.dtype, ref.shape)}); pass {role.split()[-1]} with dtype {h.dtype}, "
                "or a bytearray/memoryview to copy raw bytes"
            )
        # A whole-buffer copy reads into a destination at least as large, and
        # writes a source at most as large (Monarch's rule).
        too_small = not write and ref.nbytes < h.size
        too_large = write and ref.nbytes > h.size
        if whole and (too_small or too_large):
            need = "at least" if too_small else "at most"
            raise ValueError(
                f"size mismatch: the buffer has {h.size} bytes ({layout(h.dtype, h.shape)}) but "
                f"{role} has {ref.nbytes} bytes ({layout(ref.dtype, ref.shape)}); {role} must "
                f"have {need} {h.size} bytes, or pass offset= and size= to copy part of it"
            )
        if whole and not write:
            size = h.size
        length = ref.nbytes if size is None else operator.index(size)
        if offset < 0 or length < 0:
            raise ValueError(f"offset and size must be >= 0, got offset={offset}, size={length}")
        if length > ref.nbytes:
            raise ValueError(
                f"size mismatch: {role} has {ref.nbytes} bytes, fewer than the {length} "
                "bytes requested"
            )
        if offset + length > h.size:
            verb = "write" if write else "read"
            raise ValueError(
                f"cannot {verb} {length} bytes at offset {offset}: the buffer has only "
                f"{h.size} bytes"
            )
        if write and not h.writable:
            raise RDMAAccessError(f"{h.describe()} is read-only; it cannot be written", handle=h)
        return CopyOp(
            handle=h,
            write=write,
            offset=offset,
            length=length,
            local=ref,
            transport=resolve_transport(transport, h),
        )

    # -- lifetime --------------------------------------------------------------

    def drop(self) -> Future[None]:
        """Unregister the memory: later copies through any handle to it fail.

        In the owner this waits until copies in flight have stopped touching
        the memory (they fail with RDMABufferDroppedError). On a handle
        elsewhere it asks the owner to revoke the region. Idempotent. Returns
        a future that is already done (``.get()`` or ``await``, as Monarch's).
        """
        done: Future[None] = Future._new()
        done.set_result(None)
        if self._dropped:
            return done
        self._dropped = True
        if self._release is not None:
            self._release()
            return done
        if self._handle.pid == os.getpid() and self._handle.host_key == host_key():
            _release_registered(self._handle.region)  # our own region, by another handle
        memory = load_extension()
        try:
            request(self._handle, memory.OP_DROP)
        except Exception:
            # An owner that cannot be reached holds no region any more: nothing to drop.
            log.debug("drop of %s: owner unreachable", self._handle.describe())
        return done

    def __enter__(self) -> RDMABuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.drop()


def _rebuild(handle: Handle) -> RDMABuffer:
    return RDMABuffer._from_handle(handle)


def _with_timeout(future: Future[int], timeout: float | None, what: str) -> Future[int]:
    """``future``, failed with RDMATransferError if not done within ``timeout`` s."""
    if timeout is None:
        return future
    out: Future[int] = Future._new()

    def forward(done: Future[int]) -> None:
        error = done.exception(timeout=0)
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(done.get(timeout=0))

    def expire() -> None:
        out.set_exception(
            RDMATransferError(f"the {what} did not finish within {timeout} s (timeout=)")
        )

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()

    def finished(done: Future[int]) -> None:
        timer.cancel()
        forward(done)

    future.add_done_callback(finished)
    return out


class RDMABatch:
    """Several reads and writes submitted together, completed by one future.

    Each call validates its arguments at once; ``submit()`` starts every copy
    concurrently and returns a future of the total bytes copied, which fails
    with the first error once every copy has stopped.

    Example::

        batch = RDMABatch()
        batch.read_into(buf_a, a).read_into(buf_b, b).write_from(buf_c, c)
        total = batch.submit().get()
    """

    def __init__(self, *, transport: str | None = None) -> None:
        self._transport = transport
        self._ops: list[CopyOp] = []

    def read_into(
        self, buf: RDMABuffer, dst: Any, offset: int | None = None, size: int | None = None
    ) -> RDMABatch:
        """Add ``buf.read_into(dst, offset, size)``; returns the batch."""
        self._ops.append(buf._plan(dst, offset, size, write=False, transport=self._transport))
        return self

    def write_from(
        self, buf: RDMABuffer, src: Any, offset: int | None = None, size: int | None = None
    ) -> RDMABatch:
        """Add ``buf.write_from(src, offset, size)``; returns the batch."""
        self._ops.append(buf._plan(src, offset, size, write=True, transport=self._transport))
        return self

    def __len__(self) -> int:
        return len(self._ops)

    def submit(self) -> Future[int]:
        """Start every copy; the batch is emptied and can be reused."""
        ops, self._ops = self._ops, []
        return submit(ops)


class RDMAAction(RDMABatch):
    """Monarch's name and argument order for a batch of copies:
    ``RDMAAction().read_remote(dst, buf).write_remote(buf2, src).submit(timeout=60)``.

    As Monarch's, it copies bytes: the local memory may have any dtype, and
    only its size in bytes is checked against the buffer's (a read needs at
    least the buffer's bytes, a write at most), with ValueError at once."""

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Add a read of all of ``src`` into ``dst``; returns the action."""
        self._ops.append(
            src._plan(dst, None, None, write=False, transport=self._transport, raw=True)
        )
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Add a write of ``src`` into the start of ``dst``; returns the action."""
        self._ops.append(
            dst._plan(src, None, None, write=True, transport=self._transport, raw=True)
        )
        return self

    def submit(self, *, timeout: float | None = None) -> Future[int]:
        """Start every copy; ``timeout`` as in :meth:`RDMABuffer.read_into`.

        Unlike :meth:`RDMABatch.submit`, the action keeps its copies, as Monarch's
        does: submitting it again runs them all again (reads fetch fresh bytes);
        and, as Monarch's, they start when the future is first waited on (see
        :meth:`RDMABuffer.read_into`)."""
        ops = list(self._ops)
        return OnDemand(lambda: _with_timeout(submit(ops), timeout, "batch"))


def is_rdma_available() -> bool:
    """True if buffers can be registered here (the native extension loaded)."""
    from monarch_nb.native._loader import native_available

    return native_available()


for _cls in (RDMABuffer, RDMABatch, RDMAAction):
    _cls.__module__ = "monarch_nb.native"
