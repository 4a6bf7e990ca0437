"""What a group's ranks print: their pipes read, split into lines, kept and emitted.

Each line becomes an :class:`~._events.Output` event; a rank's last lines are
kept for status views, its stderr's for exit messages, and what faulthandler
printed when it crashed for the crash's error.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from . import _events as ev
from ._group_core import GroupCore
from ._workers import LocalWorker, WorkerProcess

_log = logging.getLogger("monarch_nb")
_FAULT_HEADER = "Fatal Python error:"  # how faulthandler's report starts
_FAULT_REPORT_LINES = 200
# What a rank prints on stderr when it refuses its log directory (another
# user's, or a link: _worker._log_file.install); the controller says it once.
_NO_LOG_FILE = "monarch_nb: no log file for this rank: "
_told_no_log_file: set[str] = set()
_told_lock = threading.Lock()


class RankOutput:
    """Reads and splits the output of a group's workers (I/O thread)."""

    def __init__(self, group: GroupCore) -> None:
        self._group = group

    def read(self, worker: WorkerProcess, stream: str, pipe: Any) -> None:
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._group.controller.loop.remove_fd(pipe.fileno())
            self.output_ended(worker, stream)
            return
        self.on_output(worker, stream, chunk)

    def output_ended(self, worker: WorkerProcess, stream: str) -> None:
        """``stream`` of ``worker`` reached its end: emit a last unterminated line."""
        if worker.partial[stream]:
            self._emit(worker, stream, worker.partial[stream])
            worker.partial[stream] = b""

    def on_output(self, worker: WorkerProcess, stream: str, chunk: bytes) -> None:
        """Bytes ``worker`` wrote to ``stream``, split into lines (I/O thread)."""
        data = worker.partial[stream] + chunk
        *lines, partial = data.split(b"\n")
        for line in lines:
            self._emit(worker, stream, line.rsplit(b"\r", 1)[-1] if b"\r" in line[:-1] else line)
        # Progress bars rewrite one line with "\r": pass each update on live.
        *updates, worker.partial[stream] = partial.split(b"\r")
        for update in updates:
            if update:
                self._emit(worker, stream, update, end="\r")

    def _emit(self, worker: WorkerProcess, stream: str, raw: bytes, end: str = "\n") -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        output = ev.Output(self._group.name, worker.rank, stream, line, end)
        if end == "\n":
            worker.output_tail.append(output)
            if stream == "stderr":
                worker.stderr_tail.append(line)
                if line.startswith(_NO_LOG_FILE):
                    _tell_no_log_file(self._group.name, worker.rank, line[len(_NO_LOG_FILE) :])
                if line.startswith(_FAULT_HEADER):
                    worker.fault_report = [line]
                elif worker.fault_report and len(worker.fault_report) < _FAULT_REPORT_LINES:
                    worker.fault_report.append(line)
        self._group.events.emit(output)

    def drain(self, worker: LocalWorker) -> None:
        for name, pipe in (("stdout", worker.popen.stdout), ("stderr", worker.popen.stderr)):
            if pipe is not None and not pipe.closed:
                for _ in range(64):  # bounded: a grandchild could hold the pipe open
                    before = worker.partial[name]
                    self.read(worker, name, pipe)
                    if worker.partial[name] == before:
                        break


def _tell_no_log_file(mesh: str, rank: int, why: str) -> None:
    """Warn once per reason (not once per rank) that ranks keep no log file."""
    with _told_lock:
        if why in _told_no_log_file:
            return
        _told_no_log_file.add(why)
    _log.warning(
        "monarch_nb: mesh %r keeps no rank log files, so procs.logs() will not find its "
        "lines (rank %d: %s). Set MONARCH_NB_LOG_DIR to a directory that only you own and "
        "can write (or unset it for ~/.monarch_nb/logs), then start the mesh again",
        mesh,
        rank,
        why,
    )
