"""The worker side of the debugger: pdb whose terminal is the controller's prompt.

Installed on every rank at start (``install_on_worker``, through the core's
``WORKER_IMPORTS``): ``breakpoint()`` and ``pdb.set_trace()`` open a
:class:`RemotePdb` whose output goes to the controller as ``DebugOutput`` and
whose input lines arrive as ``DebugInput``. Those are handed over by the wire
thread (the main thread is inside pdb, waiting), through a queue the main
thread blocks on; the kernel's interrupt (a SIGINT from the wire thread) wakes
that wait with KeyboardInterrupt, which leaves pdb and stops the rank's code.
"""

from __future__ import annotations

import os
import pdb
import queue
import sys
from collections.abc import Iterable
from typing import Any

from .._wire._messages import (
    DebugEnded,
    DebugInput,
    DebugOutput,
    DebugPrompt,
    DebugRefused,
    Message,
)

_worker: Any = None  # the rank's Worker, once installed
_lines: queue.SimpleQueue[DebugInput | DebugRefused] = queue.SimpleQueue()


class DebuggerRefused(RuntimeError):
    """The controller cannot show a prompt (no stdin, or no debugger front end)."""


class _Channel:
    """pdb's stdin and stdout: lines from the controller, text to it."""

    def __init__(self) -> None:
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        return len(text)

    def flush(self) -> None:
        if self._pending:
            text, self._pending = "".join(self._pending), []
            _worker.send(DebugOutput(text))

    def readline(self) -> str:
        raise AssertionError("RemotePdb reads through its own prompt")  # pragma: no cover


class RemotePdb(pdb.Pdb):
    """pdb on a rank, driven from the controller's ``(Pdb rank N)`` prompt."""

    def __init__(self, rank: int) -> None:
        self._channel = _Channel()
        channel: Any = self._channel
        super().__init__(stdin=channel, stdout=channel, nosigint=True, readrc=False)
        self.use_rawinput = False
        self.prompt = f"(Pdb rank {rank}) "
        self._active = False  # between the first prompt of a pause and its end

    # cmd.Cmd reads a line as: write the prompt, flush, stdin.readline(). We send
    # the prompt (and where we are) as one message and wait for the answer.
    def cmdloop(self, intro: Any = None) -> None:
        self.preloop()
        stop = None
        while not stop:
            line = self._read_line()
            line = self.precmd(line)
            stop = self.onecmd(line)
            stop = self.postcmd(stop, line)
        self.postloop()

    def _read_line(self) -> str:
        self._channel.flush()
        _worker.send(DebugPrompt(self.prompt, self._location()))
        _worker.wire.watch()  # the answer comes to the wire thread: have it watch now
        item = _lines.get()  # a SIGINT (the kernel's interrupt) raises here
        if isinstance(item, DebugRefused):
            raise DebuggerRefused(item.reason)
        return item.line + "\n" if item.line else "\n"

    def _location(self) -> str:
        frame = getattr(self, "curframe", None)
        if frame is None:
            return ""
        code = frame.f_code
        return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"

    def _cmdloop(self) -> None:
        # pdb's own loop swallows KeyboardInterrupt and prompts again; on a rank the
        # interrupt means "stop this code", as it does without a debugger.
        self.allow_kbdint = True
        self.cmdloop()
        self.allow_kbdint = False

    def interaction(self, frame: Any, traceback: Any) -> None:
        if not self._active:  # a new pause, not the next step of one
            self._active = True
            while not _lines.empty():  # a line meant for an earlier pause that had ended
                _lines.get_nowait()
        try:
            super().interaction(frame, traceback)
        except KeyboardInterrupt:
            self._stop_tracing()
            self._end("interrupted")
            raise
        except DebuggerRefused as exc:
            self._stop_tracing()
            self._end(f"refused: {exc}")
            raise
        if self.quitting:
            self._end("quit")
        elif self.stoplineno == -1:  # `c`: running until a breakpoint, if any
            self._end("continued")

    def stop_here(self, frame: Any) -> bool:
        # Stepping out of the user's code lands in the worker's own frames: the
        # user is done with this pause, so run on (and stop tracing) from here.
        if frame.f_globals.get("__name__", "").startswith("monarch_nb."):
            if self._active and not self.quitting:
                self.set_continue()
                self._end("continued")
            return False
        return super().stop_here(frame)

    def _end(self, how: str) -> None:
        if self._active:
            self._active = False
            self._channel.flush()
            _worker.send(DebugEnded(how))

    def _stop_tracing(self) -> None:
        self.set_quit()  # no trace function left behind in the rank's frames
        frame = sys._getframe().f_back
        while frame is not None:
            frame.f_trace = None
            frame = frame.f_back


def set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace()`` on a rank (it replaces it there): pause the caller until the
    controller's prompt continues it."""
    debugger = RemotePdb(_worker.rank)
    if header is not None:
        debugger.message(header)
    debugger.set_trace(sys._getframe().f_back)


def breakpoint(*, ranks: Iterable[int] | None = None) -> None:
    """Pause the calling code in the debugger, on ``ranks`` only (default: every rank).

    On a rank, opens the ``(Pdb rank N)`` prompt in the controller's cell; the
    other ranks run on. On the controller itself, the ordinary ``pdb``.
    """
    frame = sys._getframe().f_back
    if _worker is None:
        pdb.Pdb().set_trace(frame)
        return
    if ranks is not None and _worker.rank not in set(ranks):
        return
    RemotePdb(_worker.rank).set_trace(frame)


def post_mortem() -> None:
    """pdb at the frame where this rank's last failed cell or endpoint call raised."""
    tb = getattr(sys, "last_traceback", None)
    if tb is None:
        raise RuntimeError(
            f"rank {_worker.rank if _worker else '?'} has no failed call to debug: "
            "%mesh debug works after a %%mesh cell or an endpoint call raised on this rank"
        )
    debugger = RemotePdb(_worker.rank)
    debugger.reset()
    debugger.interaction(None, tb)
    debugger._end("quit" if debugger.quitting else "continued")


def _on_line(message: Message) -> None:
    _lines.put(message)  # type: ignore[arg-type]  # registered for these two types only


def _sys_breakpointhook(*args: Any, **kwargs: Any) -> None:
    RemotePdb(_worker.rank).set_trace(sys._getframe().f_back)


def install_on_worker(worker: Any) -> None:
    """Make ``breakpoint()`` and ``pdb.set_trace()`` on this rank use the controller's prompt."""
    global _worker
    _worker = worker
    worker.wire.control_handlers[DebugInput] = _on_line
    worker.wire.control_handlers[DebugRefused] = _on_line
    # PYTHONBREAKPOINT=0 still disables breakpoint(), as it does for plain Python.
    if os.environ.get("PYTHONBREAKPOINT") != "0":
        sys.breakpointhook = _sys_breakpointhook
    pdb.set_trace = set_trace
