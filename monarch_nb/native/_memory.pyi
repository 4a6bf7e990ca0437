"""Typed surface of the C extension ``monarch_nb.native._memory`` (see _memory.c).

Private: monarch_nb.native._transport and _buffer own validation and errors.
Copy functions release the GIL; file descriptors must be blocking sockets.
"""

OP_READ: int
OP_WRITE: int
OP_LEASE_READ: int
OP_LEASE_WRITE: int
OP_RELEASE: int
OP_QUERY: int
OP_DROP: int
OP_READ_SEALED: int
OP_WRITE_SEALED: int

ST_OK: int
ST_BAD_MAGIC: int
ST_BAD_VERSION: int
ST_BAD_OP: int
ST_UNKNOWN_REGION: int
ST_DROPPED: int
ST_BAD_TOKEN: int
ST_OUT_OF_RANGE: int
ST_READ_ONLY: int
ST_BUSY: int
ST_DEVICE_ERROR: int
ST_SEAL_REQUIRED: int
ST_BAD_SEAL: int
ST_NO_SEAL: int
ST_IO_ERROR: int
ST_EOF: int
ST_BAD_REPLY: int
ST_REVOKED: int
ST_VM_ERROR: int

REQUEST_MAGIC: int
REPLY_MAGIC: int
PROTOCOL_VERSION: int
REQUEST_SIZE: int
REPLY_SIZE: int
TOKEN_SIZE: int
HELLO_MAGIC: int
HELLO_SIZE: int
CHALLENGE_SIZE: int
MAC_SIZE: int
MAX_STREAMS: int
SEAL_CHUNK: int
MAX_CONNECTIONS: int
CUDA_IPC_HANDLE_SIZE: int

def register(
    address: int, size: int, token: bytes, writable: bool, device: int = -1, sealed: bool = False, /
) -> int:
    """Add a region to the table; returns its id (never reused in this process).
    ``device`` >= 0: CUDA memory on that device (after ``cuda_load``); ``sealed``:
    plain copies only through the Unix socket, sealed ones over TCP."""

def unregister(region: int, timeout_s: float, /) -> int:
    """Revoke a region and wait for its users; returns users left (0: safe to free)."""

def set_ptracer(pid: int, /) -> int:
    """prctl(PR_SET_PTRACER, pid): ``pid`` and its descendants may ptrace us
    under Yama ptrace_scope=1; returns 0 or the errno."""

def server_start(listening_fd: int, unix_fd: int = -1, /) -> None:
    """Serve the table on a native accept thread from a TCP and (optionally) a Unix
    listening socket, both non-blocking; takes ownership of the fds."""

def stats() -> tuple[int, int, int, int]:
    """(regions, registered bytes, open server connections, server started)."""

def address_of(obj: object, writable: bool, /) -> tuple[int, int]:
    """(address, nbytes) of a C-contiguous buffer-protocol object."""

def request(
    fd: int, challenge: bytes, op: int, region: int, token: bytes, offset: int, length: int, /
) -> tuple[int, int, int]:
    """One request/reply exchange: (status, value, errno)."""

def tcp_copy(
    fds: list[int],
    challenges: list[bytes],
    op: int,
    region: int,
    token: bytes,
    offset: int,
    address: int,
    length: int,
    /,
) -> tuple[int, int]:
    """READ or WRITE ``length`` bytes split over the connections: (status, errno)."""

def local_copy(
    fd: int,
    challenge: bytes,
    pid: int,
    write: bool,
    region: int,
    token: bytes,
    offset: int,
    address: int,
    length: int,
    chunk: int,
    threads: int = 1,
    /,
) -> tuple[int, int]:
    """Lease, cross-memory copy in chunks on ``threads`` threads, release: (status, errno)."""

def cuda_local_copy(
    fd: int,
    challenge: bytes,
    write: bool,
    region: int,
    token: bytes,
    offset: int,
    address: int,
    length: int,
    chunk: int,
    device: int,
    ipc_handle: bytes,
    ipc_offset: int,
    /,
) -> tuple[int, int]:
    """Lease a CUDA region, map it by IPC (``ipc_handle`` empty: the owner is this
    process), cudaMemcpy in chunks, unmap, release: (status, errno or CUDA error)."""

def cuda_load(cudart_path: str, /) -> None:
    """Open the CUDA runtime (and driver); OSError saying why it cannot."""

def cuda_ipc_export(device: int, pointer: int, /) -> tuple[tuple[bytes, int] | None, int]:
    """((IPC handle, offset of ``pointer`` in its allocation) or None, CUDA error)."""

def cuda_error(code: int, /) -> str:
    """The name of a CUDA error code."""

def hmac_sha256(key: bytes, message: bytes, /) -> bytes:
    """HMAC-SHA256 as the server checks requests with (for tests)."""

def seal_load(libcrypto_path: str, /) -> None:
    """Open OpenSSL's libcrypto for sealed copies; OSError saying why it cannot."""
