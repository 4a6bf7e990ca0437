"""Breakpoints of a script that did not call ``monarch_nb.debug.install()``.

The core asks this module for a group's debugger (``DEFAULT_DEBUGGER``) when
one of its ranks first pauses. A thread of the controller then serves every
paused rank, whatever the script's own threads do (waiting in ``get()``,
awaiting, or running on):

- stdin a terminal: the ``(Pdb rank N)`` prompt on it, as in a notebook cell;
- otherwise: a socket for ``monarch-nb debug`` in another terminal
  (:mod:`._attach`); the script says on stderr where a rank paused and how to
  attach, and the ranks wait for a client.

The terminal is read with ``os.read`` on fd 0, not ``input()``: a daemon
thread blocked in ``input()`` at exit holds stdin's buffer lock, and
Python's shutdown then aborts.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any

from .._controller._process_group import ProcGroup
from .._model._errors import format_ranks
from ._attach import AttachServer, Client, Detached, LineReader
from ._prompt import NoStdin, Prompt
from ._session import DebugSession
from ._session import session_for as _plain_session_for

ATTACH_HINT = (
    "monarch_nb: rank(s) {ranks} paused (rank {rank} at {location}); this script's stdin "
    "is not a terminal: attach from another one with `monarch-nb debug` "
    "(or `python -m monarch_nb debug --pid {pid}`)\n"
)
BANNER = (
    "── attached to pid {pid}: {argv} ──\n"
    "Mesh commands: ranks, attach R, cast RANKS CMD, continue all, help; anything "
    "else goes to pdb on the attached rank. Ctrl-D detaches (the ranks stay paused).\n"
)
IDLE = "── no rank is paused; waiting for the next breakpoint (Ctrl-C detaches) ──\n"


class FrontEnd:
    """The controller's one debugger thread for scripts (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._sessions: list[DebugSession] = []
        self._thread: threading.Thread | None = None
        self.server: AttachServer | None = None
        # Attach mode: a client past its hello, not yet served; a pipe made readable
        # when one arrives, to wake the current client's read.
        self._offered: tuple[socket.socket, LineReader] | None = None
        self._offer_r, self._offer_w = os.pipe()
        os.set_blocking(self._offer_r, False)  # only drained, and selected on
        os.set_blocking(self._offer_w, False)
        self._terminal_buffer = b""

    def add(self, session: DebugSession) -> None:
        with session.changed:
            session.wakers.append(self._changed.set)
        with self._lock:
            self._sessions.append(session)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="monarch_nb-debugger", daemon=True
                )
                self._thread.start()
        self._changed.set()

    def _paused_session(self) -> DebugSession | None:
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            if session.snapshot():
                return session
        return None

    def _run(self) -> None:
        if os.isatty(0):
            self._serve_terminal()
            return
        try:
            self.server = AttachServer(self._offer)
        except OSError as exc:  # no socket: say why, and have the breakpoints raise it
            why = f"this script's stdin is not a terminal and the debugger's socket failed: {exc}"
            sys.stderr.write(f"monarch_nb: {why}\n")
            self._refuse_all(why)
            return
        self._serve_clients()

    def _refuse_all(self, why: str) -> None:
        def refuse(prompt: str) -> str:
            raise NoStdin(why)

        while True:
            self._changed.wait()
            self._changed.clear()
            while (session := self._paused_session()) is not None:
                Prompt(session, read=refuse).serve()

    # -- on the terminal ----------------------------------------------------------------

    def _serve_terminal(self) -> None:
        prompts: dict[int, Prompt] = {}  # id(session) -> its prompt (it remembers pauses)
        while True:
            self._changed.wait()
            self._changed.clear()
            while (session := self._paused_session()) is not None:
                prompt = prompts.get(id(session))
                if prompt is None:
                    prompt = prompts[id(session)] = Prompt(session, read=self._read_terminal)
                prompt.serve()

    def _read_terminal(self, prompt: str) -> str:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        while b"\n" not in self._terminal_buffer:
            chunk = os.read(0, 4096)
            if not chunk:
                raise NoStdin("stdin is closed")
            self._terminal_buffer += chunk
        line, _, self._terminal_buffer = self._terminal_buffer.partition(b"\n")
        return line.decode(errors="replace")

    # -- to monarch-nb debug ------------------------------------------------------------

    # The wake byte is written and drained under the lock, with the offer: the pipe
    # is readable exactly while an offer waits. Written after the lock, a byte
    # could land once the serving thread (woken by a rank's pause) had taken the
    # offer and drained: the new client's first read then saw a take-over that
    # was none, and was closed without a word.

    def _offer(self, conn: socket.socket, reader: LineReader) -> None:
        with self._lock:
            old, self._offered = self._offered, (conn, reader)
            try:
                os.write(self._offer_w, b"!")
            except BlockingIOError:  # full: readable already
                pass
        if old is not None:  # offered but never served: the newer one wins
            Client(old[0], old[1], self._offer_r).close("another client attached")
        self._changed.set()

    def _take_offer(self) -> Client | None:
        with self._lock:
            offered, self._offered = self._offered, None
            try:
                while os.read(self._offer_r, 4096):  # the wake-ups of the offers taken
                    pass
            except BlockingIOError:
                pass
        return None if offered is None else Client(offered[0], offered[1], self._offer_r)

    def _serve_clients(self) -> None:
        client: Client | None = None
        told: dict[int, int] = {}  # rank -> serial of the pause announced on stderr
        prompts: dict[int, Prompt] = {}
        while True:
            self._changed.wait()
            self._changed.clear()
            newer = self._take_offer()
            if newer is not None:
                if client is not None:
                    client.close("another client attached; this one is detached")
                client, prompts = newer, {}
                try:
                    client.write(BANNER.format(pid=os.getpid(), argv=" ".join(sys.argv)))
                    if self._paused_session() is None:
                        client.write(IDLE)
                except Detached:
                    client = None
            while (session := self._paused_session()) is not None:
                if client is None or client.gone:
                    client = None
                    self._tell_stderr(session, told)
                    break
                prompt = prompts.get(id(session))
                if prompt is None:
                    prompt = prompts[id(session)] = Prompt(session, client.read, client.write)
                try:
                    prompt.serve()
                    if self._paused_session() is None:
                        client.write(IDLE)
                except Detached:
                    took_over = self._offered is not None
                    client.close(
                        "another client attached; this one is detached" if took_over else None
                    )
                    client = None
                    self._changed.set()  # look at the offers (the one that took over)

    def _tell_stderr(self, session: DebugSession, told: dict[int, int]) -> None:
        """One line for the ranks that paused since the last (not one per rank)."""
        paused = session.snapshot()
        news = sorted(r for r, pause in paused.items() if told.get(r) != pause.serial)
        if not news:
            return
        for rank in news:
            told[rank] = paused[rank].serial
        first = paused[news[0]]
        sys.stderr.write(
            ATTACH_HINT.format(
                ranks=format_ranks(news), rank=news[0], location=first.location, pid=os.getpid()
            )
        )
        sys.stderr.flush()


_front_end: FrontEnd | None = None
_front_end_lock = threading.Lock()


def front_end() -> FrontEnd:
    global _front_end
    with _front_end_lock:
        if _front_end is None:
            _front_end = FrontEnd()
        return _front_end


def session_for(group: ProcGroup) -> Any:
    """The group's session, served by this process's debugger thread (any thread)."""
    fresh = not isinstance(group.debugger, DebugSession)
    session = _plain_session_for(group)
    if fresh:
        front_end().add(session)
    return session
