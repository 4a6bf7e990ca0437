"""Rank log files: where they live, the line format, and reading them back.

Every rank writes what it prints (stdout, stderr) and the ``logging`` records
it makes, with their level, to one file per rank on its own host (the writer
is :mod:`monarch_nb._worker._log_file`)::

    <log dir>/<mesh name>/<rank>.log      (then .log.1, .log.2, ... as it rotates)

The log dir is ``MONARCH_NB_LOG_DIR``, else ``~/.monarch_nb/logs``; it and each
mesh's directory are made private (0700), the files 0600. A restarted rank
appends to the same file, so a dead rank's lines stay readable. Each line is::

    2026-11-24T19:39:34.123+00:00 stdout epoch 3 done
    2026-11-24T19:39:35.004+00:00 WARNING loss went up

(local time with its offset, then ``stdout``, ``stderr`` or a level name,
then the text). :func:`read` is what ``ProcMesh.logs()`` calls.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from .._model._errors import MeshUsageError
from .._model._public import publish
from . import _config

STREAMS = ("stdout", "stderr")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def log_root() -> str:
    """The directory that holds every mesh's logs (``MONARCH_NB_LOG_DIR``)."""
    configured = _config.get("log_dir")
    return configured or os.path.join(os.path.expanduser("~"), ".monarch_nb", "logs")


def mesh_dir(mesh: str, root: str | None = None) -> str:
    """``<root>/<mesh>``: characters other than letters, digits, ``.-_`` become ``_``."""
    name = _UNSAFE.sub("_", mesh) or "_"
    if name in (".", ".."):
        name = name.replace(".", "_")
    return os.path.join(root or log_root(), name)


def rank_path(mesh: str, rank: int, root: str | None = None) -> str:
    """The file rank ``rank`` of mesh ``mesh`` writes now."""
    return os.path.join(mesh_dir(mesh, root), f"{rank}.log")


def make_private_dir(path: str) -> None:
    """Create ``path`` (and parents) readable by this user only; tighten it if it exists.

    Raises PermissionError if ``path`` is a link, or a directory of another user
    (who could then put links in it, and make a rank write where it should not).
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} is not a directory of this user's (a link, or another user's): rank "
            "log files are not written there; set MONARCH_NB_LOG_DIR to a directory of yours"
        )
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)


@dataclass(frozen=True)
class LogLine:
    """One line a rank wrote: ``str()`` reads ``[1] 2026-11-24 19:39:34.123 epoch 3 done``.

    ``stream`` is ``"stdout"``, ``"stderr"`` or the level name of a ``logging``
    record (``"WARNING"``), shown before the text for records.
    """

    rank: int
    time: dt.datetime
    stream: str
    text: str

    @property
    def level(self) -> int | None:
        """The record's level (``logging.WARNING``), or None for printed text."""
        return None if self.stream in STREAMS else _level_number(self.stream)

    def __str__(self) -> str:
        stamp = self.time.strftime("%Y-%m-%d %H:%M:%S.") + f"{self.time.microsecond // 1000:03d}"
        kind = "" if self.stream in STREAMS else f"{self.stream} "
        return f"[{self.rank}] {stamp} {kind}{self.text}"


def _level_number(name: str) -> int:
    number = logging.getLevelName(name)
    return number if isinstance(number, int) else logging.NOTSET


def parse_line(rank: int, raw: str) -> LogLine | None:
    """A line of a rank's file, or None if it is not in the format (a torn write)."""
    parts = raw.rstrip("\n").split(" ", 2)
    if len(parts) < 2:
        return None
    try:
        when = dt.datetime.fromisoformat(parts[0])
    except ValueError:
        return None
    return LogLine(rank, when, parts[1], parts[2] if len(parts) > 2 else "")


def now_to_the_millisecond() -> dt.datetime:
    """Local time now, aware, cut to the millisecond as the files write it."""
    now = dt.datetime.now().astimezone()
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


RUNS = ("this", "all")


def since_for_runs(
    since: float | str | dt.datetime | dt.timedelta | None, runs: str, run_started: dt.datetime
) -> dt.datetime | None:
    """``since=`` narrowed to the run that began at ``run_started`` (``runs="this"``),
    or as given (``runs="all"``: every run of meshes of this name)."""
    if runs not in RUNS:
        raise MeshUsageError(
            f"runs={runs!r} is not a choice: use 'this' (the lines of this mesh's run, the "
            "default) or 'all' (every run of meshes of this name, kept in the same files)"
        )
    after = parse_since(since)
    if runs == "all" or (after is not None and after > run_started):
        return after
    return run_started


def _ago(now: dt.datetime, seconds: float) -> dt.datetime:
    """``seconds`` before ``now``; the earliest time there is for more than it reaches."""
    try:
        return now - dt.timedelta(seconds=seconds)
    except OverflowError:  # longer ago than datetime goes: every line is newer
        return dt.datetime.min.replace(tzinfo=dt.timezone.utc)


def parse_since(since: float | str | dt.datetime | dt.timedelta | None) -> dt.datetime | None:
    """``since=`` as an aware datetime: seconds ago, ``"5m"``, ``"2h"``, an ISO time,
    a timedelta (ago) or a datetime (naive means local time)."""
    now = dt.datetime.now().astimezone()
    match since:
        case None:
            return None
        case dt.datetime():
            return since if since.tzinfo else since.astimezone()
        case dt.timedelta():
            return now - since
        case bool():
            pass
        case int() | float():
            if not 0 <= since < math.inf:  # (also refuses NaN)
                raise MeshUsageError(
                    f"since={since!r} is not a time: give seconds ago as a finite number "
                    ">= 0 (300), a duration ('5m'), an ISO time or a datetime"
                )
            return _ago(now, since)
        case str():
            found = _DURATION.match(since)
            if found:
                return _ago(now, float(found[1]) * _UNIT_S[found[2]])
            try:
                return parse_since(dt.datetime.fromisoformat(since.strip()))
            except ValueError:
                pass
    raise MeshUsageError(
        f"since={since!r} is not a time: use seconds (300), a duration ('30s', '5m', '2h', "
        "'1d'), an ISO time ('2026-11-24T19:00') or a datetime"
    )


def parse_level(level: int | str | None) -> int | None:
    """``level=`` as a number: ``"WARNING"``, ``"warning"`` or ``logging.WARNING``."""
    if level is None or (isinstance(level, int) and not isinstance(level, bool)):
        return level
    if isinstance(level, str):
        number = logging.getLevelName(level.strip().upper())
        if isinstance(number, int):
            return number
    raise MeshUsageError(
        f"level={level!r} is not a logging level: use DEBUG, INFO, WARNING, ERROR, "
        "CRITICAL or a number"
    )


def _rank_files(mesh: str, rank: int, root: str | None) -> list[str]:
    """The rank's files, oldest first (rotated backups, then the current one)."""
    base = rank_path(mesh, rank, root)
    folder = os.path.dirname(base)
    prefix = os.path.basename(base) + "."
    backups: list[tuple[int, str]] = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        suffix = name[len(prefix) :] if name.startswith(prefix) else ""
        if suffix.isdigit():
            backups.append((int(suffix), os.path.join(folder, name)))
    files = [path for _, path in sorted(backups, reverse=True)]
    return [*files, base] if os.path.exists(base) else files


def _lines_of(
    rank: int, paths: Iterable[str], keep: Callable[[str], object] | None = None
) -> Iterator[LogLine]:
    """The lines of ``paths``; with ``keep``, only those whose text it accepts, tested
    before the line is parsed (a search of 1 GiB parses only what matched)."""
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for raw in f:
                    if keep is not None:
                        parts = raw.split(" ", 2)
                        if not keep(parts[2].rstrip("\n") if len(parts) > 2 else ""):
                            continue
                    line = parse_line(rank, raw)
                    if line is not None:
                        yield line
        except FileNotFoundError:
            continue  # rotated away while we read


def read(
    mesh: str,
    ranks: Iterable[int],
    *,
    grep: str | None = None,
    since: float | str | dt.datetime | dt.timedelta | None = None,
    level: int | str | None = None,
    tail: int | None = None,
    root: str | None = None,
) -> list[LogLine]:
    """The lines of ``ranks``' files on this host, oldest first (ties by rank).

    ``grep`` is a regular expression searched in the text; ``level`` keeps
    ``logging`` records at that level or above (printed text has none);
    ``tail`` keeps the last N lines that matched.
    """
    pattern, after, minimum = check_filters(grep, since, level, tail)
    found: list[LogLine] = []
    keep = pattern.search if pattern is not None else None
    for rank in ranks:
        for line in _lines_of(rank, _rank_files(mesh, rank, root), keep):
            if after is not None and line.time < after:
                continue
            if minimum is not None and (line.level is None or line.level < minimum):
                continue
            found.append(line)
    return in_order(found, tail)


def in_order(lines: list[LogLine], tail: int | None = None) -> list[LogLine]:
    """``lines`` oldest first (ties by rank), the last ``tail`` of them if given."""
    lines.sort(key=lambda line: (line.time, line.rank))
    return lines[-tail:] if tail else ([] if tail == 0 else lines)


def check_filters(
    grep: str | None,
    since: float | str | dt.datetime | dt.timedelta | None,
    level: int | str | None,
    tail: int | None,
) -> tuple[re.Pattern[str] | None, dt.datetime | None, int | None]:
    """The filters of :func:`read`, parsed; MeshUsageError for a bad one."""
    try:
        pattern = re.compile(grep) if grep is not None else None
    except re.error as exc:
        raise MeshUsageError(f"grep={grep!r} is not a regular expression: {exc}") from None
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise MeshUsageError(f"tail={tail!r} must be a non-negative int")
    return pattern, parse_since(since), parse_level(level)


publish(globals())
