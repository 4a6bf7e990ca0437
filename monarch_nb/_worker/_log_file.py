"""A rank's log file: its stdout, stderr and ``logging`` records, kept on its host.

:func:`install` wraps ``sys.stdout`` and ``sys.stderr`` so each write still
goes to the pipe the controller reads, and each completed line is also
appended, time-stamped, to the rank's file (format and place:
:mod:`monarch_nb._services._logs`). ``logging`` records are taken where they
are made (the record factory), with their level, so the user's handlers and
Python's last-resort printing behave as without us; the printed form of a
record that follows it is not written twice.

Writes are buffered: the file is flushed when the stream is flushed, after
each message the worker handles, at least every ``FLUSH_INTERVAL_S`` while
lines keep coming, and at exit. A rank killed with SIGKILL loses at most the
lines of that last interval. The file rotates at ``MONARCH_NB_LOG_MAX_BYTES``
keeping ``MONARCH_NB_LOG_BACKUPS`` older files.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, TextIO

from .._services import _config, _logs

FLUSH_INTERVAL_S = 0.5
_MAX_PARTIAL = 1 << 16  # a line without an end is cut here, not held forever
_BUFFER_BYTES = 1 << 16


class _Stamp:
    """``2026-11-24T19:39:34.123+00:00``, the seconds part formatted once per second."""

    __slots__ = ("_prefix", "_second", "_zone")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""
        self._zone = ""

    def __call__(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._update(second)
        return f"{self._prefix}.{int((now - second) * 1000):03d}{self._zone}"

    def _update(self, second: int) -> None:
        local = time.localtime(second)
        zone = time.strftime("%z", local)
        self._zone = f"{zone[:3]}:{zone[3:]}" if len(zone) == 5 else "+00:00"
        self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", local)
        self._second = second


class RankLog:
    """The rank's file: whole lines in, buffered, rotated by size."""

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        # print() from several threads; reentrant: a signal handler may print mid-write
        self.lock = threading.RLock()
        self._stamp = _Stamp()
        self._file = self._open()
        self._size = self._file.tell()
        self._last_flush = time.time()
        self.dirty = False  # written since the last flush
        # How the last record made ends ("last line\n"): its printed form, if that is
        # the next write, is skipped.
        self.pending_record: str | None = None

    def _open(self) -> TextIO:
        # Never through a link: the directory is private, this is the second lock.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o600)
        return open(fd, "a", encoding="utf-8", errors="backslashreplace", buffering=_BUFFER_BYTES)

    def write_lines(self, kind: str, lines: list[str], now: float) -> None:
        stamp = self._stamp(now)
        self._write("".join(f"{stamp} {kind} {line}\n" for line in lines), now)

    def write_line(self, kind: str, line: str, now: float) -> None:
        """One line: the hot path of ``print()``."""
        self._write(f"{self._stamp(now)} {kind} {line}\n", now)

    def _write(self, text: str, now: float) -> None:
        with self.lock:
            self._file.write(text)
            self.dirty = True
            self._size += len(text)
            if self._size >= self.max_bytes > 0:
                self._rotate()
            elif now - self._last_flush > FLUSH_INTERVAL_S:
                self._flush()

    def flush(self) -> None:
        # After every call: most write nothing, and then there is nothing to take the
        # lock for (a line this thread wrote set dirty before this reads it).
        if self.dirty:
            with self.lock:
                self._flush()

    def _flush(self) -> None:
        self.dirty = False
        try:
            self._file.flush()
        except (OSError, ValueError):
            pass  # a full disk or a closed file must not break the rank's print()
        self._last_flush = time.time()

    def _rotate(self) -> None:
        self._file.close()
        if self.backups > 0:
            for index in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{index}"
                if os.path.exists(older):
                    os.replace(older, f"{self.path}.{index + 1}")
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._file = self._open()
        self._size = 0
        self._last_flush = time.time()

    def close(self) -> None:
        with self.lock:
            try:
                self._file.close()
            except (OSError, ValueError):
                pass


class Tee:
    """A text stream that writes through to ``stream`` and logs whole lines."""

    def __init__(self, stream: Any, log: RankLog, kind: str) -> None:
        self._stream = stream
        self._log = log
        self._kind = kind
        self._partial = ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        log = self._log
        if log.pending_record is not None:
            pending, log.pending_record = log.pending_record, None
            # A handler prints a record in one write, ending with the record's last
            # line; print() writes its newline apart, so it never matches.
            if text.endswith(pending):
                return written  # a record's printed form: the file has the record
        if text == "\n":  # print() ends each line with a write of its own
            line, self._partial = self._partial, ""
            if "\r" in line:
                line = _last_redraw(line)
            log.write_line(self._kind, line, time.time())
            return written
        if "\n" not in text:
            partial = self._partial + text
            if "\r" in partial:  # a progress bar redraws its line: keep the last state
                partial = partial.rsplit("\r", 1)[1]
            self._partial = partial[-_MAX_PARTIAL:]
            return written
        first, *middle, last = (self._partial + text).split("\n")
        lines = [first, *middle]
        self._partial = last[-_MAX_PARTIAL:]
        log.write_lines(self._kind, [_last_redraw(line) for line in lines], time.time())
        return written

    def flush(self) -> None:
        self._stream.flush()
        self._log.flush()

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)


def _last_redraw(line: str) -> str:
    line = line.rstrip("\r")
    return line.rsplit("\r", 1)[1] if "\r" in line else line


_installed: RankLog | None = None


def install(mesh: str, rank: int) -> RankLog | None:
    """Start logging this rank to its file (None if ``MONARCH_NB_LOG_FILES=0`` without
    ``MONARCH_NB_FORCE_FILE_LOG=1``, or if the directory cannot be made: a rank runs
    without its file rather than not at all)."""
    global _installed
    if not (_config.get("log_files") or _config.get("force_file_log")):
        return None
    try:
        root = _logs.log_root()
        _logs.make_private_dir(root)
        folder = _logs.mesh_dir(mesh, root)
        _logs.make_private_dir(folder)
        log = RankLog(
            _logs.rank_path(mesh, rank, root),
            _config.get("log_max_bytes"),
            _config.get("log_backups"),
        )
    except OSError as exc:
        print(f"monarch_nb: no log file for this rank: {exc}", file=sys.stderr)
        return None
    sys.stdout = Tee(sys.stdout, log, "stdout")
    sys.stderr = Tee(sys.stderr, log, "stderr")
    _take_records(log)
    _installed = log
    return log


def _take_records(log: RankLog) -> None:
    make = logging.getLogRecordFactory()
    formatter = logging.Formatter()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # a bad format string: logging reports it when it prints
            return record
        lines = text.splitlines() or [""]
        if record.exc_info and record.exc_info[0] is not None:
            lines += formatter.formatException(record.exc_info).splitlines()
        log.write_lines(record.levelname, lines, record.created)
        log.pending_record = lines[-1] + "\n"
        return record

    logging.setLogRecordFactory(factory)
