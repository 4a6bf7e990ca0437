"""The worker side of the debugger: pdb whose terminal is the controller's prompt.

Imported on a rank at its first ``breakpoint()`` or ``import pdb`` (see
:mod:`._hook`, which every rank loads at start): they open a
:class:`RemotePdb` whose output goes to the controller as ``DebugOutput`` and
whose input lines arrive as ``DebugInput``. Those are handed over by the wire
thread (the main thread is inside pdb, waiting), through a queue the main
thread blocks on; the kernel's interrupt (a SIGINT from the wire thread) wakes
that wait with KeyboardInterrupt, which leaves pdb and stops the rank's code.
"""

from __future__ import annotations

import pdb
import sys
from typing import Any

from .._wire._messages import DebugEnded, DebugOutput, DebugPrompt, DebugRefused
from . import _hook
from ._hook import breakpoint, install_on_worker, set_trace

_lines = _hook.lines


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
            _hook.worker().send(DebugOutput(text))

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
        _hook.worker().send(DebugPrompt(self.prompt, self._location()))
        _hook.worker().wire.watch()  # the answer comes to the wire thread: have it watch now
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
            _hook.worker().send(DebugEnded(how))

    def _stop_tracing(self) -> None:
        self.set_quit()  # no trace function left behind in the rank's frames
        frame = sys._getframe().f_back
        while frame is not None:
            frame.f_trace = None
            frame = frame.f_back


def post_mortem() -> None:
    """pdb at the frame where this rank's last failed cell or endpoint call raised."""
    tb = getattr(sys, "last_traceback", None)
    if tb is None:
        raise RuntimeError(
            f"rank {_hook.worker().rank if _hook.worker() else '?'} has no failed call to debug: "
            "%mesh debug works after a %%mesh cell or an endpoint call raised on this rank"
        )
    debugger = RemotePdb(_hook.worker().rank)
    debugger.reset()
    debugger.interaction(None, tb)
    debugger._end("quit" if debugger.quitting else "continued")


__all__ = ["RemotePdb", "breakpoint", "install_on_worker", "post_mortem", "set_trace"]
