"""Shipping a workspace (code and data files) to hosts that do not share a file system.

The controller packs the directories and files it is given into one tar
archive (:func:`pack`; gzipped if asked: on a fast link, compressing costs
more than it saves); each host's agent unpacks it under a destination
directory (:func:`unpack`) and puts that directory on the ``PYTHONPATH`` of
the workers it starts afterwards. The archive travels on the agent's signed,
CURVE-encrypted link, so no rsync or shared mount is needed.

Unpacking takes only regular files and directories, each inside the
destination: no absolute paths, no ``..``, no links, no devices (what
``tarfile``'s "data" filter refuses), so a crafted archive cannot write
anywhere else. Only the controller, which holds the mesh key, can send one.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

# Left out of every archive: version control, caches, notebook checkpoints.
SKIPPED_NAMES = frozenset({".git", "__pycache__", ".ipynb_checkpoints", ".mypy_cache"})
SKIPPED_SUFFIXES = (".pyc",)
# An archive is one message: keep it well under the wire's frame cap.
MAX_ARCHIVE_BYTES = 512 << 20


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
            if buffer.tell() > MAX_ARCHIVE_BYTES:
                break
    archive = buffer.getvalue()
    if len(archive) > MAX_ARCHIVE_BYTES:
        raise ValueError(
            f"sync_workspace: the archive of {list(paths)!r} is {len(archive) >> 20} MiB, "
            f"over the {MAX_ARCHIVE_BYTES >> 20} MiB one message may carry; "
            "sync fewer or smaller paths (data sets belong on the hosts' own storage)"
        )
    return Packed(archive, files, nbytes)


def unpack(archive: bytes, dest: str) -> tuple[str, int, int]:
    """Unpack ``archive`` into ``dest`` (``~`` expanded, made if missing), regular
    files and directories only, each inside ``dest``; ``(dest, files, bytes)``.
    Raises ValueError naming the first member that would escape or is not a file."""
    dest = os.path.abspath(os.path.expanduser(dest))
    os.makedirs(dest, exist_ok=True)
    files = nbytes = 0
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        members = tar.getmembers()
        for member in members:
            target = os.path.abspath(os.path.join(dest, member.name))
            inside = target == dest or target.startswith(dest + os.sep)
            if not inside or os.path.isabs(member.name) or not (member.isfile() or member.isdir()):
                raise ValueError(f"refused archive member {member.name!r}: not a plain file inside")
        # Python 3.10.12+/3.11.4+ have tarfile's own "data" filter: a second guard.
        if hasattr(tarfile, "data_filter"):
            tar.extraction_filter = tarfile.data_filter
        for member in members:
            tar.extract(member, dest, set_attrs=False)
            if member.isfile():
                files, nbytes = files + 1, nbytes + member.size
    return dest, files, nbytes
