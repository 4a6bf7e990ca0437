"""A job's state file, and proof that a saved pid is still the agent it names.

The file (``.monarch_nb/job_state.json`` by default) often sits in a project
directory that other people can write to, or that came out of a repository,
so it is data, never code:

- its directory and the file itself must be this user's, and writable by
  nobody else (a file group or others may write is refused, as key files are);
- it is read and written through a descriptor of its directory, never through
  a link: the file is opened with ``O_NOFOLLOW``, and written as a fresh 0600
  file (``O_EXCL``, a random name in the same directory) that replaces it, so
  a link planted at the file's path or beside it redirects nothing;
- what a job does with it (which commands to run, which pids to signal) is the
  caller's business (``_jobs``): a pid is signalled only when
  :func:`same_process` proves it is the process that was saved.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import time
from typing import Any

from .._wire._private_paths import refuse_unless_private

# A state file is a few kilobytes; anything far bigger was not written by us.
_MAX_BYTES = 1 << 20


def _refuse_unless_ours(info: os.stat_result, path: str, what: str, *, directory: bool) -> None:
    """Raise PermissionError unless ``info`` is this user's and nobody else may write it."""
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    noun = "directory" if directory else "regular file"
    if not kind_ok:
        raise PermissionError(f"{what} {path!r} is not a {noun}; remove it, or pass another path")
    refuse_unless_private(
        info,
        what,
        path,
        harm="make it start or stop processes as you",
        remedy="Remove it, or pass cached_path= a path in a directory of yours",
        yours="its content is yours",
    )


def _open_dir(directory: str, *, create: bool, sticky_ok: bool = False) -> int | None:
    """A descriptor of ``directory`` once checked (None when it is missing and not made).

    ``sticky_ok``: also a directory others may write but whose sticky bit keeps
    them from renaming or removing our files (``/tmp``), owned by root or us."""
    if create:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP, ENOTDIR: a link or a file where the directory should be
        raise PermissionError(
            f"job state directory {directory!r} is not a directory of yours ({exc.strerror}); "
            "remove it, or pass cached_path= a path in a directory of yours"
        ) from None
    try:
        info = os.fstat(fd)
        sticky = info.st_mode & stat.S_ISVTX and info.st_uid in (0, os.getuid())
        if not (sticky_ok and sticky and stat.S_ISDIR(info.st_mode)):
            _refuse_unless_ours(info, directory, "job state directory", directory=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_dir(directory: str) -> None:
    """Make ``directory`` (0700) if missing; refuse it unless it is ours and private to write."""
    fd = _open_dir(directory, create=True)
    assert fd is not None
    os.close(fd)


def read(path: str) -> dict[str, Any] | None:
    """The JSON object saved at ``path``, or None when there is none.

    Raises PermissionError for a file or directory that is not ours, that
    others may write, or that is a link; ValueError for one that is not a
    state file.
    """
    data = read_bytes(path)
    if data is None:
        return None
    try:
        record = json.loads(data) if len(data) <= _MAX_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise ValueError(f"{path!r} is not a monarch_nb job state file; remove it")
    return record


def read_bytes(path: str, *, sticky_ok: bool = False) -> bytes | None:
    """The bytes saved at ``path`` (None when there is none), checked as :func:`read` does."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _open_dir(directory, create=False, sticky_ok=sticky_ok)
    if dir_fd is None:
        return None
    try:
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PermissionError(
                f"job state file {path!r} cannot be opened safely ({exc.strerror}: a link?); "
                "remove it"
            ) from None
        with os.fdopen(fd, "rb") as f:
            _refuse_unless_ours(os.fstat(f.fileno()), path, "job state file", directory=False)
            data = f.read(_MAX_BYTES + 1)
    finally:
        os.close(dir_fd)
    if len(data) > _MAX_BYTES:
        raise ValueError(f"{path!r} is not a monarch_nb job state file (too big); remove it")
    return data


def write(path: str, record: dict[str, Any]) -> None:
    """Save ``record`` at ``path``: a new 0600 file in the checked directory, then a rename."""
    write_bytes(path, json.dumps(record, indent=1).encode())


def write_bytes(path: str, data: bytes, *, sticky_ok: bool = False) -> None:
    """Save ``data`` at ``path`` as :func:`write` does."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _open_dir(directory, create=True, sticky_ok=sticky_ok)
    assert dir_fd is not None
    try:
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            # rename() replaces a link at ``name`` itself; its target is not touched.
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def remove(path: str, *, sticky_ok: bool = False) -> None:
    """Remove the state file at ``path`` (nothing if missing), through its checked directory."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _open_dir(directory, create=False, sticky_ok=sticky_ok)
    if dir_fd is None:
        return
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dir_fd)


# -- which process a pid is ---------------------------------------------------------


def boot_id() -> str:
    """This boot's id: a pid and its start time mean nothing across a reboot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None  # exited, only waits to be reaped
    return int(fields[19])


def identity(pid: int, argv: list[str]) -> dict[str, Any]:
    """What proves later that ``pid`` is still the process started with ``argv``."""
    return {"pid": pid, "start_time": start_time(pid), "boot_id": boot_id(), "argv": argv}


def same_process(saved: dict[str, Any]) -> bool:
    """Whether the process ``saved`` (an :func:`identity`) still runs: same boot, same pid,
    same start time, same command line."""
    pid = saved.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    if saved.get("boot_id") != boot_id() or saved.get("start_time") != start_time(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")[:-1]
    except OSError:
        return False
    return [arg.decode(errors="surrogateescape") for arg in cmdline] == saved.get("argv")


def terminate(saved: dict[str, Any], grace: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` s, the process ``saved`` names, only if it is
    still that process; returns whether it was.

    The pid is pinned with a pidfd before it is checked, so a process that
    exits and whose pid is reused after the check is never signalled.
    """
    try:
        pidfd = os.pidfd_open(saved["pid"])
    except (OSError, KeyError, TypeError, ValueError):
        return False
    try:
        if not same_process(saved):
            return False
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            exited = select.poll()  # a pidfd reads ready once its process has exited
            exited.register(pidfd, select.POLLIN)
            deadline = time.monotonic() + grace
            while not exited.poll(max(0.0, deadline - time.monotonic()) * 1000):
                if time.monotonic() >= deadline:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    break
        except ProcessLookupError:
            pass
        return True
    finally:
        os.close(pidfd)
