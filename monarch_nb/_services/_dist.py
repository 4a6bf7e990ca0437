"""torch.distributed's rendezvous for a mesh, without a port open to the network.

``init_process_group`` with ``env://`` starts torch's TCPStore on rank 0, and
that store listens on every interface, unauthenticated (PyTorch's security
policy says to keep it off untrusted networks). On one host there is no need
for a port at all: ranks meet in a FileStore in the tree's private run
directory (mode 0700, our uid only). Meshes on several hosts still use
``env://`` (MASTER_ADDR on the first host): docs/security.md says so.

A user's own ``init_process_group(backend)`` on one host takes ``env://`` all
the same, with the loopback MASTER_ADDR the mesh gives it; torch's store would
still listen on every interface (it binds the wildcard address whatever
MASTER_ADDR says). ``keep_store_on_loopback`` makes that store listen on the
loopback address it is reached at, and only there.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import ipaddress
import os
import secrets
import socket
import stat
import sys
from collections.abc import Sequence
from datetime import timedelta
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from .._wire import _rundir

# Set by the controller for ranks on its own host: a fresh file in the run directory.
STORE_ENV = "MONARCH_NB_DIST_FILE"


def fresh_store_path() -> str:
    """A new rendezvous file in the tree's private run directory: one per process
    group, since a FileStore holds what its group wrote."""
    return os.path.join(_rundir.run_dir(), f"dist-{secrets.token_hex(8)}")


def init_kwargs() -> dict[str, Any]:
    """The rendezvous arguments for ``torch.distributed.init_process_group`` here."""
    path = os.environ.get(STORE_ENV)
    if not path:
        return {}  # env:// (several hosts)
    return {
        "init_method": f"file://{path}",
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


# The TCP sockets that the process group made by init_process_group here opened
# (gloo's connections to the other ranks, its store's), as (fd, inode): what
# shut_process_group_sockets shuts down once that group is broken.
_group_sockets: list[tuple[int, int]] = []


def init_process_group(backend: str, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group(backend)`` with this mesh's rendezvous."""
    import torch.distributed as dist

    before = _tcp_sockets()
    dist.init_process_group(backend, **init_kwargs(), **kwargs)
    _group_sockets[:] = [(fd, ino) for fd, ino in _tcp_sockets().items() if before.get(fd) != ino]


def _tcp_sockets() -> dict[int, int]:
    """fd -> inode of this process's connected TCP sockets (our own links to the
    controller are Unix sockets)."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            try:
                fd = int(name)
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    continue
                with socket.socket(fileno=os.dup(fd)) as probe:
                    # Connections only: gloo's own listener ends the process
                    # (an abort in its loop thread) if its accept() fails.
                    if probe.family in (socket.AF_INET, socket.AF_INET6) and not (
                        probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                    ):
                        found[fd] = os.fstat(fd).st_ino
            except OSError:  # closed meanwhile (the listing's own fd, say)
                continue
    return found


def shut_process_group_sockets() -> int:
    """Shut down the connections of the process group init_process_group made here,
    so that ranks blocked on this one in a collective are told at once (gloo keeps
    a broken group's connections open, and they would wait out its timeout);
    how many. Only sockets still open under the same inode: never one whose
    number was reused since."""
    current = _tcp_sockets()
    shut = 0
    for fd, inode in _group_sockets:
        if current.get(fd) != inode:
            continue
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as connection:
            connection.shutdown(socket.SHUT_RDWR)
            shut += 1
    _group_sockets.clear()
    return shut


_RENDEZVOUS = "torch.distributed.rendezvous"


def keep_store_on_loopback() -> None:
    """Make the TCPStore that ``env://`` and ``tcp://`` rendezvous start on rank 0
    listen on its address when that address is a loopback one, not on every
    interface. Never imports torch: patches its rendezvous module when (if) user
    code imports it. Other addresses (several hosts) are left as torch has them."""
    module = sys.modules.get(_RENDEZVOUS)
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds torch's rendezvous module through the other finders, then patches it
    as soon as it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != _RENDEZVOUS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)  # get_source, is_package...


def _patch(module: ModuleType) -> None:
    original = getattr(module, "_create_c10d_store", None)
    if original is None or getattr(original, "_on_loopback", False):
        return  # a torch without it: left alone

    def create_c10d_store(
        hostname: str, port: int, rank: int, world_size: int, timeout: timedelta, *args: Any
    ) -> Any:
        server = None
        if rank == 0 and not module._torchelastic_use_agent_store():
            server = _loopback_server(hostname, port, world_size, timeout, *args)
        try:
            # torch's multi-tenant store on rank 0 takes the server already
            # listening on this port, ours, and holds it from here on.
            return original(hostname, port, rank, world_size, timeout, *args)
        finally:
            del server

    create_c10d_store._on_loopback = True  # type: ignore[attr-defined]
    setattr(module, "_create_c10d_store", create_c10d_store)  # noqa: B010


def _loopback_server(
    hostname: str, port: int, world_size: int, timeout: timedelta, use_libuv: bool = True
) -> Any:
    """A TCPStore server listening on loopback ``hostname``:``port`` only, or None
    (another address, port 0, or the port taken: then torch's own error says so)."""
    try:
        address = ipaddress.ip_address("127.0.0.1" if hostname == "localhost" else hostname)
    except ValueError:
        return None
    if not address.is_loopback or not port:
        return None
    from torch.distributed import TCPStore

    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own
        sock.bind((str(address), port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        return None
    fd = sock.detach()
    try:
        return TCPStore(
            str(address),
            port,
            world_size,
            True,
            timeout,
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=fd,
            use_libuv=use_libuv,
        )
    except Exception:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
