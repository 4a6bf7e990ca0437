"""A private directory for this process tree's ``ipc://`` sockets.

Unix sockets are files: whoever may open the file may connect. The first
process of a tree (a controller) makes one directory, mode 0700, and every
process it starts inherits its path (``MONARCH_NB_RUN_DIR``, set in the
child's environment: a path, not a secret), so only our own uid can reach the
sockets inside it at all. The directory is removed when the process that made
it exits; one whose maker was killed (SIGKILL, a crashed kernel) cannot be, so
the next tree that makes one on the host removes those first: its name carries
its maker's pid, its pid namespace (a /tmp shared between containers holds
pids of other namespaces) and its host (a ``TMPDIR`` on a file system that
several hosts share, common on clusters, holds pids of other hosts: their
first pid namespaces even have the same inode), and a directory of ours whose
maker is gone is nobody's.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
import threading

from ._pids import pid_alive

ENV_VAR = "MONARCH_NB_RUN_DIR"
# The pid of this tree's first process on this host (the controller, or a host
# agent): only its descendants may read a rank's memory (RDMABuffer, see
# monarch_nb.native._transport), so it travels down the tree like the run dir.
TREE_ROOT_ENV = "MONARCH_NB_TREE_ROOT"


def tree_root() -> int:
    """The pid of this process tree's root on this host (ourselves if we are it)."""
    inherited = os.environ.get(TREE_ROOT_ENV, "")
    return int(inherited) if inherited.isdigit() else os.getpid()


# sockaddr_un.sun_path is 108 bytes with its NUL: keep room for a socket's name.
_MAX_DIR_CHARS = 70

_lock = threading.Lock()
_path: str | None = None
_PREFIX = "monarch_nb-run-"
# namespace, pid, host, random (mkdtemp's)
_STALE = re.compile(re.escape(_PREFIX) + r"(\d+)-(\d+)-([0-9a-f]{6})-[^/]+")


def run_dir() -> str:
    """This tree's private socket directory, made (0700) on first use if inherited none."""
    global _path
    with _lock:
        if _path is not None and os.path.isdir(_path):
            return _path
        inherited = os.environ.get(ENV_VAR)
        if inherited and _is_private(inherited):
            _path = inherited
            return _path
        _path = _make()
        os.environ[ENV_VAR] = _path
        return _path


def socket_path(name: str) -> str:
    """``ipc://`` address of a socket called ``name`` in the run directory."""
    return f"ipc://{os.path.join(run_dir(), name)}"


def _make() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    if len(base) > _MAX_DIR_CHARS - 51 or not os.access(base, os.W_OK):  # name: 51 at most
        base = tempfile.gettempdir()
    creator, namespace, host = os.getpid(), _pid_namespace(), host_tag()
    if namespace:
        _remove_stale(base, namespace, host)
    path = tempfile.mkdtemp(prefix=f"{_PREFIX}{namespace}-{creator}-{host}-", dir=base)  # 0700

    def remove() -> None:
        if os.getpid() == creator:  # not in a forked child that inherited the handler
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path


def _pid_namespace() -> int:
    """This process's pid namespace (its inode), 0 if unknown (then nothing is swept)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def host_tag() -> str:
    """Six hex digits of this host's name: which host made a run directory."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _remove_stale(base: str, namespace: int, host: str) -> None:
    """Remove the run directories in ``base`` that processes of our pid namespace
    on this host made and that are gone (killed before their exit handler ran).
    A maker's pid that a live process now has keeps its directory: left, never
    wrongly removed; so does one another host made, or an older version (its
    name has no host)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        match = _STALE.fullmatch(name)
        if (
            match is None
            or int(match.group(1)) != namespace
            or match.group(3) != host
            or pid_alive(int(match.group(2)))
        ):
            continue
        path = os.path.join(base, name)
        if _is_private(path):  # ours, and only ours
            shutil.rmtree(path, ignore_errors=True)


def _is_private(path: str) -> bool:
    """A directory we own that nobody else may enter (else we make our own)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )
