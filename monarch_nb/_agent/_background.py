"""An agent's requests that take seconds: py-spy runs on its workers, and
workspace archives to unpack. Each runs on a thread of its own; its reply is
queued here and the agent's loop, the one owner of the sockets, sends it when
woken through a pipe."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterator

from .._services import _py_spy, _workspace
from .._wire._fd_limits import ExhaustionWarning, exhausted
from .._wire._messages import Message, PySpyReply, PySpyRequest, SyncWorkspace, WorkspaceSynced


class BackgroundRequests:
    """The slow requests in flight, and the replies they left for the loop."""

    def __init__(self, fd_warning: ExhaustionWarning) -> None:
        self.fd_warning = fd_warning
        self.workspaces: list[str] = []  # synced directories, on workers' PYTHONPATH
        self._done: collections.deque[Message] = collections.deque()
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)

    def run_py_spy(self, request: PySpyRequest, pid: int | None) -> None:
        """Run py-spy on worker ``pid`` (None: it has exited), in a thread: a
        record takes seconds."""
        if pid is None:
            self._finished(
                request.request_id,
                _py_spy.Outcome(_py_spy.NO_SUCH_WORKER, "", "the process had exited"),
            )
            return

        def run() -> None:
            try:
                outcome = _py_spy.execute(
                    pid,
                    mode=request.mode,
                    native=request.native,
                    seconds=request.seconds,
                    fmt=request.fmt,
                    rate=request.rate,
                    timeout=request.timeout,
                    full_filenames=request.full_filenames,
                )
            except OSError as exc:  # no fd for its pipes: this request fails, said
                if exhausted(exc):
                    self.fd_warning.failed("running py-spy", exc)
                why = f"the agent could not run py-spy: {type(exc).__name__}: {exc}"
                outcome = _py_spy.Outcome(1, "", why)
            self._finished(request.request_id, outcome)

        threading.Thread(target=run, name="monarch_nb-py-spy", daemon=True).start()

    def sync_workspace(self, request: SyncWorkspace) -> None:
        """Unpack a workspace archive, in a thread (a big one takes a while)."""

        def run() -> None:
            try:
                path, files, nbytes = _workspace.unpack(request.archive, request.dest)
            except Exception as exc:  # a full disk, no memory: said, not a silent timeout
                reply = WorkspaceSynced(
                    request.request_id, request.dest, 0, 0, f"{type(exc).__name__}: {exc}"
                )
            else:
                if request.on_path and path not in self.workspaces:
                    self.workspaces.append(path)
                reply = WorkspaceSynced(request.request_id, path, files, nbytes, "")
            self._queue(reply)

        threading.Thread(target=run, name="monarch_nb-workspace", daemon=True).start()

    def replies(self) -> Iterator[Message]:
        """(the loop, woken) The replies finished since, in order."""
        try:
            os.read(self.wake_fd, 4096)
        except BlockingIOError:
            pass
        while self._done:
            yield self._done.popleft()

    def _finished(self, request_id: int, outcome: _py_spy.Outcome) -> None:
        reply = PySpyReply(
            request_id, outcome.returncode, outcome.stdout, outcome.stderr, outcome.data
        )
        self._queue(reply)

    def _queue(self, reply: Message) -> None:
        """Any thread: leave the reply for the loop and wake it."""
        self._done.append(reply)
        os.write(self._wake_w, b"x")
