"""Moving bytes: the owner's server, the reader's connections and copy engines.

Owner side: the first registration starts a native server thread (see
``_memory.c``) listening on ``MONARCH_NB_RDMA_HOST`` (default 127.0.0.1) and
``MONARCH_NB_RDMA_PORT`` (default: any free port); handles advertise
``MONARCH_NB_RDMA_ADVERTISE`` or the bound address. The same server listens
on a Unix socket in the tree's private run directory (mode 0700; the server
also checks the peer's uid with SO_PEERCRED): readers on the owner's host
connect there, where no other user can reach, and TCP is left to other hosts.

Reader side: copies run on daemon worker threads that call into C with the
GIL released, over pooled connections to the owner's server. Two transports:

``local``  the owner grants a lease over TCP, the reader copies with
           process_vm_readv/writev (a CUDA region: maps it with CUDA IPC and
           copies with cudaMemcpy), then releases the lease;
``tcp``    the owner's server streams the bytes over one or more connections
           (a CUDA region through page-locked staging in the owner).

``MONARCH_NB_RDMA_TRANSPORT`` (or the ``transport=`` argument) picks one;
``auto`` (the default) uses ``local`` when the owner shares this kernel and pid
namespace and cross-memory attach is permitted (for a CUDA region: when this
process already uses CUDA and the region could be exported), ``tcp`` otherwise.
CUDA memory on the reader's side is staged through a page-locked host buffer
where the copy is not device to device.

Native status codes become exceptions in exactly one place: ``_failure``.
"""

from __future__ import annotations

import atexit
import errno
import functools
import hashlib
import hmac
import logging
import os
import queue
import socket
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from monarch_nb._model._future import Future
from monarch_nb._wire import _rundir
from monarch_nb.native import _cudart, _sealing
from monarch_nb.native._errors import (
    RDMAAccessError,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMATransferError,
)
from monarch_nb.native._handle import Handle, host_key
from monarch_nb.native._loader import load_extension
from monarch_nb.native._memoryref import MemoryRef

ENV_TRANSPORT = "MONARCH_NB_RDMA_TRANSPORT"
ENV_HOST = "MONARCH_NB_RDMA_HOST"
ENV_PORT = "MONARCH_NB_RDMA_PORT"
ENV_ADVERTISE = "MONARCH_NB_RDMA_ADVERTISE"
ENV_STREAMS = "MONARCH_NB_RDMA_TCP_STREAMS"
ENV_TIMEOUT = "MONARCH_NB_RDMA_TIMEOUT"
TRANSPORTS = ("auto", "local", "tcp")

#: Layout of a request on the wire (see _memory.c): magic, version, op, region,
#: nonce, offset, length, MAC (HMAC-SHA256 under the region's token of the
#: connection's challenge and the fields before it, cut to 16 bytes).
REQUEST_FORMAT = "<IHHQQQQ16s"
#: Layout of a reply header: magic, status, value.
REPLY_FORMAT = "<IIQ"
#: Layout of the server's hello, the first bytes of every connection: magic, challenge.
HELLO_FORMAT = "<I16s"

_LOCAL_CHUNK = 16 << 20  # revocation is noticed within one chunk
_CUDA_CHUNK = 256 << 20  # the same for CUDA copies, which run ~100x faster
_STREAM_BYTES = 16 << 20  # one more TCP stream per this many bytes
_MAX_IDLE_PER_OWNER = 8
_CONNECT_TIMEOUT_S = 10.0

log = logging.getLogger("monarch_nb.native")


# -- owner side ---------------------------------------------------------------

_server_lock = threading.Lock()
# pid, bound, advertised, Unix socket path (None: none could be made)
_server: tuple[int, tuple[str, int], tuple[str, int], str | None] | None = None
_ptracer_set_for_pid = 0


def start_server(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """Start this process's native buffer server (once) and return its advertised address.

    ``host``/``port`` default to ``MONARCH_NB_RDMA_HOST`` (127.0.0.1) and
    ``MONARCH_NB_RDMA_PORT`` (0: any free port). Pass ``host="0.0.0.0"`` to
    serve other hosts. Registration calls this implicitly; call it first to
    choose the interface.
    """
    global _server, _ptracer_set_for_pid
    memory = load_extension()
    with _server_lock:
        pid = os.getpid()
        if _server is not None and _server[0] == pid:
            bound, advertised = _server[1], _server[2]
            if host is not None and host != bound[0]:
                raise RuntimeError(
                    f"the buffer server of this process already listens on {bound[0]}:{bound[1]}; "
                    f"it cannot move to {host!r}: call start_server() before the first RDMABuffer"
                )
            return advertised
        host = host or os.environ.get(ENV_HOST) or "127.0.0.1"
        port = int(os.environ.get(ENV_PORT, "0")) if port is None else port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=128)
        bound = sock.getsockname()[:2]
        advertise = os.environ.get(ENV_ADVERTISE) or (
            socket.gethostbyname(socket.gethostname()) if host in ("0.0.0.0", "::", "") else host
        )
        sock.setblocking(False)  # the native accept loop polls; see _memory_server.c
        if not _sealing.available():  # serve plain requests only: sealed ones get ST_NO_SEAL
            log.debug("no libcrypto: this buffer server cannot seal copies")
        local = _unix_listener()
        memory.server_start(sock.detach(), local[1] if local else -1)
        _server = (pid, (bound[0], bound[1]), (advertise, bound[1]), local[0] if local else None)
        if _ptracer_set_for_pid != pid:
            # Under Yama ptrace_scope=1 (Ubuntu's default) a rank may not
            # process_vm_readv its siblings. Name our tree's root on this host as
            # our ptracer: Yama then admits it and its descendants (the mesh's own
            # processes, nested meshes too) and no other process of this uid.
            # Failure is fine: no Yama here, or the TCP transport.
            memory.set_ptracer(_rundir.tree_root())
            _ptracer_set_for_pid = pid
        return _server[2]


def local_socket() -> str | None:
    """The Unix socket path of this process's buffer server (None before it starts,
    or where none could be made)."""
    return _server[3] if _server is not None and _server[0] == os.getpid() else None


def _unix_listener() -> tuple[str, int] | None:
    """A listening Unix socket in the tree's private directory: (path, fd)."""
    try:
        path = os.path.join(_rundir.run_dir(), f"rdma-{os.getpid()}-{os.urandom(4).hex()}.sock")
        if len(path) >= 100:  # sun_path holds 108 bytes
            return None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(128)
        listener.setblocking(False)
    except OSError as exc:
        log.debug("no Unix socket for the buffer server (%s): local readers use TCP", exc)
        return None
    atexit.register(_remove_socket, path, os.getpid())
    return path, listener.detach()


def _remove_socket(path: str, owner: int) -> None:
    if os.getpid() != owner:  # a forked child inherited the handler, not the socket
        return
    try:
        os.unlink(path)
    except OSError:
        pass


@dataclass(frozen=True)
class RDMAStatistics:
    """A snapshot of this process's data plane (owner side)."""

    registered_buffers: int
    registered_bytes: int
    server_connections: int
    server_address: tuple[str, int] | None


def statistics() -> RDMAStatistics:
    """Return how many buffers this process serves and how many connections are open."""
    regions, nbytes, conns, _started = load_extension().stats()
    server = _server[2] if _server is not None and _server[0] == os.getpid() else None
    return RDMAStatistics(regions, nbytes, conns, server)


# -- reader side: connections -------------------------------------------------


@dataclass
class Connection:
    """A connection to an owner's server and the challenge its hello carried
    (every request on it is signed over that challenge)."""

    sock: socket.socket
    challenge: bytes
    local: bool = False  # over the owner's Unix socket (on its host): nothing to seal

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def sign_request(
    challenge: bytes, token: bytes, op: int, region: int, nonce: int, offset: int, length: int
) -> bytes:
    """A request as the C client makes it (tests speak the protocol with this)."""
    memory = load_extension()
    fields = struct.pack(
        REQUEST_FORMAT[:-3],
        memory.REQUEST_MAGIC,
        memory.PROTOCOL_VERSION,
        op,
        region,
        nonce,
        offset,
        length,
    )
    mac = hmac.new(token, challenge + fields, hashlib.sha256).digest()[: memory.MAC_SIZE]
    return fields + mac


def read_hello(sock: socket.socket) -> bytes:
    """Read a server's hello; return its challenge (ConnectionError if it is none)."""
    memory = load_extension()
    data = b""
    while len(data) < memory.HELLO_SIZE:
        chunk = sock.recv(memory.HELLO_SIZE - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection before its hello")
        data += chunk
    magic, challenge = struct.unpack(HELLO_FORMAT, data)
    if magic != memory.HELLO_MAGIC:
        raise ConnectionError("the peer is not a monarch_nb buffer server (no hello)")
    return challenge


class _ConnectionPool:
    """Idle connections to owners' servers, reused across copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: dict[tuple[str, int, int, str | None], list[Connection]] = {}

    def take(self, handle: Handle, n: int) -> list[Connection]:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent owns those sockets
                self._pid, self._idle = os.getpid(), {}
            idle = self._idle.setdefault(_key(handle), [])
            socks = [idle.pop() for _ in range(min(n, len(idle)))]
        dead = [s for s in socks if not _idle_and_open(s.sock)]
        self.discard(dead)
        socks = [s for s in socks if s not in dead]
        try:
            while len(socks) < n:
                socks.append(connect(handle))
        except BaseException:
            self.discard(socks)
            raise
        return socks

    def give(self, handle: Handle, socks: list[Connection]) -> None:
        with self._lock:
            idle = self._idle.setdefault(_key(handle), [])
            keep = max(0, _MAX_IDLE_PER_OWNER - len(idle))
            idle.extend(socks[:keep])
        self.discard(socks[keep:])

    @staticmethod
    def discard(socks: list[Connection]) -> None:
        for s in socks:
            s.close()

    def close_all(self) -> None:
        """Close every idle connection (at exit: owners may be long gone)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for socks in idle.values():
            self.discard(socks)


def _key(handle: Handle) -> tuple[str, int, int, str | None]:
    # The pid too: a later owner may listen on the port of one that exited. And
    # the way in: a connection to the owner's Unix socket is not one over TCP.
    local = handle.unix if handle.host_key == host_key() else None
    return (*handle.server, handle.pid, local)


def _idle_and_open(sock: socket.socket) -> bool:
    """An idle connection has nothing to read; EOF or a reset means the owner left."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


_pool = _ConnectionPool()
atexit.register(_pool.close_all)


def _connect_local(handle: Handle) -> socket.socket | None:
    """The owner's Unix socket, if it shares this host and has one (else None)."""
    if handle.unix is None or handle.host_key != host_key():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_CONNECT_TIMEOUT_S)
    try:
        sock.connect(handle.unix)
    except OSError:
        sock.close()
        return None  # another tree's directory we cannot enter, or the owner left: TCP
    return sock


def connect(handle: Handle) -> Connection:
    """Open a blocking connection to the owner's server (with kernel I/O timeouts)
    and read its hello: over its Unix socket on the same host, TCP otherwise."""
    sock = _connect_local(handle)
    local = sock is not None
    try:
        if sock is None:
            sock = socket.create_connection(handle.server, timeout=_CONNECT_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        host, port = handle.server
        raise RDMAOwnerGoneError(
            f"cannot reach the owner of {handle.describe()}: connecting to {host}:{port} failed "
            f"({exc.strerror or exc}); the owning process has exited or its server is not "
            "reachable from here",
            handle=handle,
        ) from exc
    sock.settimeout(None)  # the C side needs a blocking socket
    timeout = float(os.environ.get(ENV_TIMEOUT, "120"))
    tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    try:
        challenge = read_hello(sock)
    except OSError as exc:
        sock.close()
        host, port = handle.server
        raise RDMAOwnerGoneError(
            f"cannot reach the owner of {handle.describe()}: {host}:{port} did not greet "
            f"({exc}); the owning process has exited, or another program listens there",
            handle=handle,
        ) from exc
    return Connection(sock, challenge, local)


def request(handle: Handle, op: int, offset: int = 0, length: int = 0) -> tuple[int, int]:
    """Send one control request (QUERY, DROP) on a fresh connection: (status, value)."""
    memory = load_extension()
    with connect(handle) as conn:
        status, value, _err = memory.request(
            conn.fileno(), conn.challenge, op, handle.region, handle.token, offset, length
        )
    return status, value


# -- reader side: workers -----------------------------------------------------


class _Workers:
    """Daemon threads that run copies (in C, GIL released) and complete futures."""

    def __init__(self, max_threads: int = 8) -> None:
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._max = max_threads
        self._threads = 0
        self._idle = 0

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            start = self._idle == 0 and self._threads < self._max
            if start:
                self._threads += 1
            else:
                self._idle -= 1  # that idle thread is spoken for
        self._tasks.put(task)
        if start:
            threading.Thread(target=self._loop, name="monarch-nb-rdma", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._tasks.get()()
            with self._lock:
                self._idle += 1


_workers = _Workers()


# -- copies -------------------------------------------------------------------


@dataclass(frozen=True)
class CopyOp:
    """One validated copy between a registered buffer and local memory."""

    handle: Handle
    write: bool
    offset: int
    length: int
    local: MemoryRef
    transport: str  # "local" or "tcp" after resolution, or "auto" to fall back

    @property
    def verb(self) -> str:
        return "write" if self.write else "read"


_local_refused: set[str] = set()  # host keys where cross-memory attach is not permitted


def resolve_transport(choice: str | None, handle: Handle) -> str:
    """Turn ``transport=`` / MONARCH_NB_RDMA_TRANSPORT into "local", "tcp" or "auto"."""
    value = (choice or os.environ.get(ENV_TRANSPORT) or "auto").strip().lower()
    if value not in TRANSPORTS:
        raise ValueError(
            f"unknown RDMA transport {value!r} (from {'transport=' if choice else ENV_TRANSPORT}); "
            f"choose one of {', '.join(TRANSPORTS)}"
        )
    same_host = handle.host_key == host_key()
    if value == "local" and not same_host:
        raise ValueError(
            f"transport 'local' needs the owner on this host, but {handle.describe()} lives on "
            "another host (or pid namespace); use transport='tcp' or 'auto'"
        )
    if value == "auto" and (not same_host or handle.host_key in _local_refused):
        return "tcp"
    if handle.device >= 0 and handle.pid != os.getpid():
        mappable = handle.ipc is not None
        if value == "local" and not mappable:
            raise ValueError(
                f"transport 'local' needs a CUDA IPC handle, and {handle.describe()} could not "
                "export one (expandable segments?); use transport='tcp' or 'auto'"
            )
        if value == "auto" and not (mappable and _cudart.reader_uses_cuda()):
            return "tcp"  # a CPU-only reader would have to make a CUDA context first
    return value


def run(op: CopyOp) -> int:
    """Perform ``op`` on the calling thread; return the number of bytes copied."""
    if op.handle.device >= 0 and op.transport != "tcp":
        return _cuda_local(op)
    if op.local.device >= 0:
        return _staged(op)
    if op.transport == "tcp":
        return _tcp(op)
    try:
        return _local(op)
    except _LocalRefused:
        if op.transport == "local":
            raise RDMAAccessError(
                f"this process may not read {op.handle.describe()} with process_vm_readv "
                "(EPERM: different user, or ptrace restricted); use transport='tcp'",
                handle=op.handle,
            ) from None
        _local_refused.add(op.handle.host_key)
        return _tcp(op)


class _LocalRefused(Exception):
    pass


def _with_connections(
    op: CopyOp, count: int, copy: Callable[[list[Connection]], tuple[int, int]]
) -> tuple[int, int]:
    """Run a native copy on ``count`` pooled connections to the owner.

    The connections go back to the pool only after a clean copy; after a
    failure (or an exception) their state is unknown, so they are closed.
    """
    socks = _pool.take(op.handle, count)
    try:
        status, err = copy(socks)
    except BaseException:
        _pool.discard(socks)
        raise
    if status == load_extension().ST_OK:
        _pool.give(op.handle, socks)
    else:
        _pool.discard(socks)
    return status, err


def _local(op: CopyOp) -> int:
    memory = load_extension()
    status, err = _with_connections(
        op,
        1,
        lambda socks: memory.local_copy(
            socks[0].fileno(),
            socks[0].challenge,
            op.handle.pid,
            op.write,
            op.handle.region,
            op.handle.token,
            op.offset,
            op.local.address,
            op.length,
            _LOCAL_CHUNK,
            _local_threads(op.length),
        ),
    )
    if status == memory.ST_OK:
        return op.length
    if status == memory.ST_VM_ERROR and err in (errno.EPERM, errno.ENOSYS):
        raise _LocalRefused
    raise _failure(op, status, err)


def _cuda_local(op: CopyOp) -> int:
    """A CUDA region on this host: lease, map by CUDA IPC, cudaMemcpy, release.

    The local side may be host or device memory (cudaMemcpyDefault); a region
    that cannot be mapped here falls back to TCP unless ``local`` was asked for.
    """
    memory = _cudart.load()
    h = op.handle
    same_process = h.pid == os.getpid() and h.host_key == host_key()
    if same_process:
        device, ipc, ipc_offset = h.device, b"", 0
    else:
        assert h.ipc is not None  # resolve_transport sends unexportable regions by TCP
        device = op.local.device if op.local.device >= 0 else _cudart.current_device()
        ipc, ipc_offset = h.ipc
    status, err = _with_connections(
        op,
        1,
        lambda socks: memory.cuda_local_copy(
            socks[0].fileno(),
            socks[0].challenge,
            op.write,
            h.region,
            h.token,
            op.offset,
            op.local.address,
            op.length,
            _CUDA_CHUNK,
            device,
            ipc,
            ipc_offset,
        ),
    )
    if status == memory.ST_OK:
        return op.length
    if status == memory.ST_DEVICE_ERROR and not same_process and op.transport == "auto":
        log.debug("CUDA IPC of %s failed (%s): by TCP", h.describe(), memory.cuda_error(err))
        return _staged(replace(op, transport="tcp")) if op.local.device >= 0 else _tcp(op)
    raise _failure(op, status, err)


def _staged(op: CopyOp) -> int:
    """Copy to or from local CUDA memory through a page-locked host buffer."""
    torch = sys.modules["torch"]
    device_bytes = op.local.keepalive.reshape(-1).view(torch.uint8)[: op.length]
    host = torch.empty(op.length, dtype=torch.uint8, pin_memory=True)
    if op.write:
        host.copy_(device_bytes)
    staging = MemoryRef(
        address=host.data_ptr(),
        nbytes=op.length,
        dtype=None,
        shape=(op.length,),
        writable=True,
        kind="staging",
        keepalive=host,
    )
    copied = run(replace(op, local=staging))
    if not op.write:
        device_bytes.copy_(host)
    return copied


def _local_threads(length: int) -> int:
    # One cross-memory copy stream does not saturate memory bandwidth; a few do.
    return max(1, min(4, os.cpu_count() or 1, length // _STREAM_BYTES))


def _streams(length: int) -> int:
    configured = os.environ.get(ENV_STREAMS)
    if configured:
        return max(1, min(int(configured), load_extension().MAX_STREAMS))
    return max(1, min(4, length // _STREAM_BYTES))


def _tcp(op: CopyOp) -> int:
    memory = load_extension()

    def opcode(socks: list[Connection]) -> int:
        # Over the network, seal where the owner asks it or this reader does; the
        # owner's Unix socket never leaves its host.
        if (op.handle.sealed or _sealing.wanted()) and not all(s.local for s in socks):
            _sealing.load()
            return memory.OP_WRITE_SEALED if op.write else memory.OP_READ_SEALED
        return memory.OP_WRITE if op.write else memory.OP_READ

    status, err = _with_connections(
        op,
        _streams(op.length),
        lambda socks: memory.tcp_copy(
            [s.fileno() for s in socks],
            [s.challenge for s in socks],
            opcode(socks),
            op.handle.region,
            op.handle.token,
            op.offset,
            op.local.address,
            op.length,
        ),
    )
    if status == memory.ST_OK:
        return op.length
    raise _failure(op, status, err)


def _failure(op: CopyOp, status: int, err: int) -> RDMAError:
    """Translate a native status into the exception the caller sees."""
    m = load_extension()
    h = op.handle
    what = f"{op.verb} of {op.length} bytes at offset {op.offset} of {h.describe()}"
    if status == m.ST_DROPPED:
        # The owner answers a wrong token as it answers a dropped buffer, so a
        # prober learns nothing about which buffers are live.
        return RDMABufferDroppedError(
            f"{what} was refused: the buffer has been dropped, or this handle's token is "
            "not its owner's (a forged or corrupted handle); ask its owner for a new handle",
            handle=h,
        )
    if status == m.ST_BAD_TOKEN:
        return RDMAAccessError(
            f"{what} was refused: the capability token does not match the registered buffer "
            "(the handle is forged or corrupted)",
            handle=h,
        )
    if status == m.ST_UNKNOWN_REGION:
        return RDMAAccessError(
            f"{what} was refused: the process at {h.server[0]}:{h.server[1]} never registered "
            f"buffer #{h.region} (the handle belongs to another process)",
            handle=h,
        )
    if status == m.ST_READ_ONLY:
        return RDMAAccessError(f"{what} was refused: the buffer is read-only", handle=h)
    if status == m.ST_OUT_OF_RANGE:
        return RDMAAccessError(
            f"{what} was refused: the range lies outside the registered region "
            "(the handle's size does not match its owner's)",
            handle=h,
        )
    if status == m.ST_DEVICE_ERROR:
        return RDMATransferError(
            f"{what} failed on the GPU: CUDA error {err} ({m.cuda_error(err)})", handle=h
        )
    if status == m.ST_SEAL_REQUIRED:
        return RDMAAccessError(
            f"{what} was refused: its owner lets it cross the network only sealed, and this "
            "handle does not say so (a forged or altered handle)",
            handle=h,
        )
    if status == m.ST_BAD_SEAL:
        return RDMATransferError(
            f"{what} failed: a sealed chunk did not pass its check (the bytes were altered on "
            "the way); nothing unchecked was kept",
            handle=h,
        )
    if status == m.ST_NO_SEAL:
        return RDMAAccessError(
            f"{what} was refused: a sealed copy was asked for ({_sealing.ENV_ENCRYPT}) and "
            "the owner cannot seal (no OpenSSL libcrypto in its process)",
            handle=h,
        )
    if status == m.ST_BUSY:
        return RDMATransferError(
            f"{what} was refused: the owner serves too many connections", handle=h
        )
    if status == m.ST_VM_ERROR and err == errno.ESRCH:
        return RDMAOwnerGoneError(
            f"{what} failed: the owning process exited during the copy", handle=h
        )
    if status in (m.ST_EOF, m.ST_IO_ERROR, m.ST_REVOKED, m.ST_VM_ERROR):
        return _diagnose(op, what, status, err)
    return RDMATransferError(
        f"{what} failed: protocol error (status {status}); are both sides running the same "
        "monarch_nb version?",
        handle=h,
    )


def _diagnose(op: CopyOp, what: str, status: int, err: int) -> RDMAError:
    """A copy broke mid-way: ask the owner (on a fresh connection) why."""
    m = load_extension()
    h = op.handle
    try:
        now, _ = request(h, m.OP_QUERY)
    except (RDMAOwnerGoneError, ConnectionError):
        now = m.ST_EOF
    if now in (m.ST_EOF, m.ST_IO_ERROR):
        # It could not answer a query either: a dying owner's kernel may still
        # accept the connection, then reset it.
        return RDMAOwnerGoneError(
            f"{what} failed: the owning process has exited (or became unreachable)",
            handle=h,
        )
    if now in (m.ST_DROPPED, m.ST_UNKNOWN_REGION):
        return RDMABufferDroppedError(
            f"{what} failed: the buffer was dropped while the {op.verb} was in flight",
            handle=h,
        )
    if err == errno.EAGAIN:
        return RDMATransferError(
            f"{what} timed out: no progress for {os.environ.get(ENV_TIMEOUT, '120')} s "
            f"(set {ENV_TIMEOUT} to wait longer)",
            handle=h,
        )
    reason = os.strerror(err) if err else "the connection closed early"
    return RDMATransferError(f"{what} failed: {reason}", handle=h)


def submit(ops: list[CopyOp]) -> Future[int]:
    """Run ``ops`` concurrently on the worker threads; one future for all of them.

    The future completes only when every copy has stopped, with the total
    number of bytes or with the first error.
    """
    fut: Future[int] = Future._new()
    if not ops:
        fut.set_result(0)
        return fut
    state: dict[str, Any] = {"left": len(ops), "bytes": 0, "error": None}
    lock = threading.Lock()

    def task(op: CopyOp) -> None:
        copied, error = 0, None
        try:
            copied = run(op)
        except BaseException as exc:
            error = exc
        with lock:
            state["bytes"] += copied
            if error is not None and state["error"] is None:
                state["error"] = error
            state["left"] -= 1
            last = state["left"] == 0
        if last:
            if state["error"] is not None:
                fut.set_exception(state["error"])
            else:
                fut.set_result(state["bytes"])

    for op in ops:
        _workers.submit(functools.partial(task, op))
    return fut
