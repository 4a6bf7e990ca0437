"""Shipping a workspace (code and data files) to hosts that do not share a file system.

The controller packs the directories and files it is given into one tar
archive (:func:`pack`; gzipped if asked: on a fast link, compressing costs
more than it saves); each host's agent unpacks it under a destination
directory (:func:`unpack`) and puts that directory on the ``PYTHONPATH`` of
the workers it starts afterwards. The archive travels on the agent's signed,
CURVE-encrypted link, so no rsync or shared mount is needed.

Unpacking takes only regular files and directories, each inside the
destination: no absolute paths, no ``..``, no links, no devices, so a crafted
archive cannot write anywhere else. Only the controller, which holds the mesh
key, can send one. It does not lean on ``tarfile``'s "data" filter (missing
before Python 3.10.12/3.11.4) nor on paths: every member is written relative
to a descriptor of the destination, each directory on its way opened with
``O_NOFOLLOW``, each file written as a new file renamed into place, so a link
already in the destination redirects nothing (it is replaced). The destination
sits on every worker's ``PYTHONPATH``: it must be the user's and writable by
nobody else. An archive is capped in members and unpacked bytes, with an
error that says which.
"""

from __future__ import annotations

import io
import os
import secrets
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from .._wire._private_paths import refuse_unless_private

# Left out of every archive: version control, caches, notebook checkpoints.
SKIPPED_NAMES = frozenset({".git", "__pycache__", ".ipynb_checkpoints", ".mypy_cache"})
SKIPPED_SUFFIXES = (".pyc",)
# An archive is one message: keep it well under the wire's frame cap.
MAX_ARCHIVE_BYTES = 512 << 20
# What one archive may unpack to: a compressed archive is small on the wire and
# need not be on disk, and a workspace of code and small files is far under both.
MAX_MEMBERS = 100_000
MAX_UNPACKED_BYTES = 2 << 30
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Packed:
    """An archive and what went into it."""

    archive: bytes
    files: int
    nbytes: int  # of the files, before compression


def default_dest(paths: Sequence[str]) -> str:
    """Where a workspace goes on a host unless told: ``~/.monarch_nb/workspace/<name>``."""
    name = os.path.basename(os.path.abspath(paths[0])) or "root"
    return os.path.join("~", ".monarch_nb", "workspace", name)


def local_path(path: str) -> tuple[str, bool]:
    """``path`` made absolute (``~`` expanded) and whether it is a directory;
    raises ValueError if it is neither a file nor a directory (the one check of
    both ways a workspace travels: packed for an agent, rsync over ssh)."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        return path, True
    if os.path.isfile(path):
        return path, False
    raise ValueError(f"sync_workspace: {path!r} is neither a file nor a directory")


def pack(paths: Sequence[str], *, compress: bool = False) -> Packed:
    """A tar (gzipped with ``compress``) of ``paths``: a directory's contents at the
    archive's top, a file by its name. Raises ValueError naming what is missing
    or too large."""
    buffer = io.BytesIO()
    files = nbytes = 0
    options = {"mode": "w:gz", "compresslevel": 1} if compress else {"mode": "w"}
    with tarfile.open(fileobj=buffer, **options) as tar:
        for given in paths:
            path, is_dir = local_path(given)
            if not is_dir:
                tar.add(path, arcname=os.path.basename(path), recursive=False)
                files, nbytes = files + 1, nbytes + os.path.getsize(path)
                continue
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIPPED_NAMES)
                for name in sorted(names):
                    full = os.path.join(root, name)
                    if name.endswith(SKIPPED_SUFFIXES) or not os.path.isfile(full):
                        continue  # links to elsewhere, sockets, devices: not a workspace
                    if os.path.islink(full):
                        continue
                    tar.add(full, arcname=os.path.relpath(full, path), recursive=False)
                    files, nbytes = files + 1, nbytes + os.path.getsize(full)
                    _check_caps(files, nbytes, f"the workspace {list(paths)!r}")
            if buffer.tell() > MAX_ARCHIVE_BYTES:
                break
    _check_caps(files, nbytes, f"the workspace {list(paths)!r}")
    archive = buffer.getvalue()
    if len(archive) > MAX_ARCHIVE_BYTES:
        raise ValueError(
            f"sync_workspace: the archive of {list(paths)!r} is {len(archive) >> 20} MiB, "
            f"over the {MAX_ARCHIVE_BYTES >> 20} MiB one message may carry; "
            "sync fewer or smaller paths (data sets belong on the hosts' own storage)"
        )
    return Packed(archive, files, nbytes)


def _check_caps(members: int, nbytes: int, what: str) -> None:
    """ValueError when ``members`` or ``nbytes`` is over what one archive may unpack to."""
    if members > MAX_MEMBERS:
        raise ValueError(
            f"sync_workspace: {what} has more than {MAX_MEMBERS:,} files and directories, "
            "the most one archive may unpack; sync fewer paths (leave out generated or "
            "vendored trees)"
        )
    if nbytes > MAX_UNPACKED_BYTES:
        raise ValueError(
            f"sync_workspace: {what} unpacks to more than {_size(MAX_UNPACKED_BYTES)} "
            f"({_size(nbytes)} so far), the most one archive may; sync fewer or smaller "
            "paths (data sets belong on the hosts' own storage)"
        )


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} bytes"


def _member_parts(member: tarfile.TarInfo) -> list[str]:
    """The path components of ``member`` under the destination; ValueError naming
    it unless it is a regular file or directory with a relative path, no ``..``."""
    name = member.name
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if (
        name.startswith("/")
        or ".." in parts
        or not (member.isfile() or member.isdir())
        or (member.isfile() and not parts)
    ):
        raise ValueError(f"refused archive member {name!r}: not a plain file inside")
    return parts


def _refuse_unless_private(fd: int, path: str) -> None:
    """PermissionError unless the directory open at ``fd`` is this user's and nobody
    else may write to it (it goes on the workers' PYTHONPATH: its files run as you)."""
    refuse_unless_private(
        os.fstat(fd),
        "sync_workspace: destination",
        path,
        harm="put code on your workers' PYTHONPATH",
        remedy="Remove it, or pass dest= a directory of yours",
        yours="it is yours",
    )


def _open_dir(name: str, dir_fd: int | None, path: str) -> int:
    """A descriptor of directory ``name`` (relative to ``dir_fd``), never through a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP, ENOTDIR: a link or a file where it should be
        raise PermissionError(
            f"sync_workspace: {path!r} is not a directory ({exc.strerror}); a link there is "
            "not followed: remove it, or pass dest= a directory of yours"
        ) from None
    try:
        _refuse_unless_private(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_dirs(path: str) -> None:
    """``path`` and its missing parents, each made 0755 (less the umask): never
    writable by group or others, whatever the umask."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            pass


def _subdir(parent: int, name: str, path: str) -> int:
    """A descriptor of directory ``name`` in ``parent``, made if missing; anything else
    there (a link, a file, a fifo) is removed first: the archive says it is a directory."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent)
        info = None
    if info is None:
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass  # made meanwhile: opened without following, and checked, below
    return _open_dir(name, parent, path)


def _write_file(parent: int, name: str, data: IO[bytes] | None, path: str) -> None:
    """``data`` as the file ``name`` in ``parent``: a new 0644 file (less the umask)
    renamed over whatever was there, so a link, fifo or hard link at ``name`` is
    replaced and nothing it points to is written."""
    tmp = f".{name[:100]}.{secrets.token_hex(6)}.part"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as out:
            while data is not None and (chunk := data.read(_CHUNK)):
                out.write(chunk)
        try:
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except IsADirectoryError:
            raise ValueError(
                f"sync_workspace: {path!r} is a directory in the destination and a file "
                "in the archive; remove it"
            ) from None
    except BaseException:
        os.unlink(tmp, dir_fd=parent)
        raise


def unpack(archive: bytes, dest: str) -> tuple[str, int, int]:
    """Unpack ``archive`` into ``dest`` (``~`` expanded, made if missing), regular
    files and directories only, each inside ``dest``; ``(dest, files, bytes)``.

    Every member is checked before anything is written. Raises ValueError
    naming the first member that would escape or is not a file, or the cap an
    archive is over (:data:`MAX_MEMBERS`, :data:`MAX_UNPACKED_BYTES`);
    PermissionError when ``dest`` (or a directory in it) is a link, is not
    yours, or is writable by group or others.
    """
    dest = os.path.abspath(os.path.expanduser(dest))
    _make_dirs(dest)
    members: list[tuple[tarfile.TarInfo, list[str]]] = []
    nbytes = 0
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        for member in tar:  # counted as read: a bomb of headers stops at the cap
            nbytes += member.size if member.isfile() else 0
            _check_caps(len(members) + 1, nbytes, "the archive")
            members.append((member, _member_parts(member)))
        root = _open_dir(dest, None, dest)
        files = 0
        try:
            for member, parts in members:
                names = parts if member.isdir() else parts[:-1]
                fd, path = root, dest
                try:
                    for name in names:
                        path = os.path.join(path, name)
                        child = _subdir(fd, name, path)
                        if fd != root:
                            os.close(fd)
                        fd = child
                    if member.isfile():
                        path = os.path.join(path, parts[-1])
                        _write_file(fd, parts[-1], tar.extractfile(member), path)
                        files += 1
                finally:
                    if fd != root:
                        os.close(fd)
        finally:
            os.close(root)
    return dest, files, nbytes
