"""``monarch-nb debug``: the paused ranks of a script, from another terminal.

A script whose stdin is not a terminal serves its breakpoints on a Unix
socket, ``debug-<pid>.sock`` in its run directory (mode 0700, see
``_wire/_rundir.py``): only its own user can reach the socket at all, and the
server also checks the peer's uid (``SO_PEERCRED``) before it reads a byte.
Nothing secret travels and no command line holds one.

A connection must say hello (one line) within :data:`HELLO_TIMEOUT_S`, on a
thread of its own, before it is given the prompt: one that says nothing, or
something else, is closed without stalling the paused ranks or a real client.
One client is served at a time; a new one takes over from the old (as
Monarch's ``monarch debug`` does), which is told so.

The protocol is JSON, one object per line. The client sends
``{"hello": "monarch_nb debug", "version": 1}`` then ``{"line": ...}`` per
line typed; the server sends ``{"out": text}``, ``{"prompt": text}`` (then
waits for a line) and ``{"bye": why}``. The client closing the connection
detaches: the ranks stay paused for the next client.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import queue
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from .._wire._pids import pid_alive
from .._wire._rundir import run_dir

HELLO = {"hello": "monarch_nb debug", "version": 1}
HELLO_TIMEOUT_S = 10.0
MAX_LINE = 64 * 1024  # a line longer than this closes the connection
MAX_PENDING = 8  # connections not yet past their hello; more are closed at once
SOCKET_GLOB = "monarch_nb-run-*/debug-*.sock"


class Detached(Exception):
    """The client left (or another took over): the ranks stay paused."""


def socket_name(pid: int) -> str:
    return f"debug-{pid}.sock"


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class LineReader:
    """Lines from a socket, at most MAX_LINE bytes each."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self._buffer = b""

    def pending(self) -> bool:
        return b"\n" in self._buffer

    def feed(self) -> bool:
        """Read what arrived; False at end of stream. Raises ValueError past MAX_LINE."""
        chunk = self.conn.recv(65536)
        if not chunk:
            return False
        self._buffer += chunk
        if b"\n" not in self._buffer and len(self._buffer) > MAX_LINE:
            raise ValueError(f"a line longer than {MAX_LINE} bytes")
        return True

    def take(self) -> dict[str, Any]:
        """The next line, decoded (call when :meth:`pending`). Raises ValueError."""
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > MAX_LINE:
            raise ValueError(f"a line longer than {MAX_LINE} bytes")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("not a JSON object")
        return message


def send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


class Client:
    """One attached ``monarch-nb debug``, as the prompt's read and write."""

    def __init__(self, conn: socket.socket, reader: LineReader, wake_fd: int) -> None:
        self.conn = conn
        self.reader = reader
        self._wake_fd = wake_fd  # readable when another client takes over
        self.gone = False

    def write(self, text: str) -> None:
        if self.gone:
            raise Detached("the client left")
        try:
            send(self.conn, {"out": text})
        except OSError:
            self.gone = True
            raise Detached("the client left") from None

    def read(self, prompt: str) -> str:
        if self.gone:
            raise Detached("the client left")
        try:
            send(self.conn, {"prompt": prompt})
            while not self.reader.pending():
                ready, _, _ = select.select([self.conn.fileno(), self._wake_fd], [], [])
                if self._wake_fd in ready:
                    raise Detached("another client took over")
                if not self.reader.feed():
                    raise Detached("the client left")
            line = self.reader.take().get("line")
        except (OSError, ValueError):
            self.gone = True
            raise Detached("the client left") from None
        except Detached:
            self.gone = True
            raise
        if not isinstance(line, str):
            self.gone = True
            raise Detached("the client sent something that is not a line")
        return line

    def close(self, why: str | None = None) -> None:
        self.gone = True
        try:
            if why is not None:
                send(self.conn, {"bye": why})
        except OSError:
            pass
        self.conn.close()


class AttachServer:
    """Listens on ``debug-<pid>.sock`` and hands each client past its hello to ``offer``."""

    def __init__(self, offer: Callable[[socket.socket, LineReader], None]) -> None:
        self._offer = offer
        self.path = os.path.join(run_dir(), socket_name(os.getpid()))
        if os.path.exists(self.path):
            os.unlink(self.path)  # ours (the run dir is): a previous server's
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self._listener.listen(16)
        self._pending = threading.Semaphore(MAX_PENDING)
        # The run directory may be inherited (a script started from a kernel, or
        # from a program that uses monarch_nb) and outlive us: our socket must not,
        # or a later process given our pid would be listed as a paused program.
        owner = os.getpid()
        atexit.register(lambda: self.close() if os.getpid() == owner else None)
        threading.Thread(target=self._accept, name="monarch_nb-debug-attach", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            if _peer_uid(conn) != os.getuid() or not self._pending.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(
                target=self._greet, args=(conn,), name="monarch_nb-debug-hello", daemon=True
            ).start()

    def _greet(self, conn: socket.socket) -> None:
        reader = LineReader(conn)
        try:
            conn.settimeout(HELLO_TIMEOUT_S)
            deadline = time.monotonic() + HELLO_TIMEOUT_S
            while not reader.pending():
                if time.monotonic() > deadline or not reader.feed():
                    raise ValueError("no hello")
            hello = reader.take()
            if hello != HELLO:
                send(conn, {"bye": f"expected {json.dumps(HELLO)} first, got something else"})
                raise ValueError("a wrong hello")
            conn.settimeout(None)
        except (OSError, ValueError):
            conn.close()
            return
        finally:
            self._pending.release()
        self._offer(conn, reader)

    def close(self) -> None:
        self._listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


# -- the client: ``monarch-nb debug`` --------------------------------------------------


def find_sockets(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, path) of the debug sockets of this user's live programs, by pid."""
    bases = {tempfile.gettempdir()}
    if os.environ.get("XDG_RUNTIME_DIR"):
        bases.add(os.environ["XDG_RUNTIME_DIR"])
    found: dict[int, str] = {}
    for base in bases:
        for path in glob.glob(os.path.join(base, SOCKET_GLOB)):
            name = os.path.basename(path)
            digits = name[len("debug-") : -len(".sock")]
            if not digits.isdigit():
                continue
            owner = int(digits)
            try:
                mine = os.stat(path).st_uid == os.getuid()
            except OSError:
                continue
            if mine and pid_alive(owner) and (pid is None or owner == pid):
                found[owner] = path
    return sorted(found.items())


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
        return " ".join(w.decode(errors="replace") for w in words if w)
    except OSError:
        return "?"


def choose_socket(pid: int | None, wait: float | None, say: Callable[[str], None]) -> str | None:
    """The one program to attach to, waiting up to ``wait`` s (None: forever) for one."""
    deadline = None if wait is None else time.monotonic() + wait
    told = False
    while True:
        found = find_sockets(pid)
        if len(found) == 1:
            return found[0][1]
        if len(found) > 1:
            listing = "\n".join(f"  --pid {p}: {describe(p)}" for p, _ in found)
            say(f"several programs have paused ranks; choose one:\n{listing}\n")
            return None
        if deadline is not None and time.monotonic() > deadline:
            which = f"program {pid}" if pid is not None else "no program of yours"
            say(f"{which} has a paused rank to attach to (waited {wait} s)\n")
            return None
        if not told:
            which = f"program {pid}" if pid is not None else "a program"
            say(f"waiting for {which} to pause at a breakpoint (Ctrl-C stops)...\n")
            told = True
        time.sleep(0.2)


DETACHED = "\n── detached; the ranks stay paused (run monarch-nb debug again) ──\n"
ENDED = "\n── the program ended ──\n"


def run_client(pid: int | None = None, wait: float | None = None) -> int:
    """Attach this terminal to a paused program; returns the exit status."""

    def say(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    if threading.current_thread() is not threading.main_thread():
        return _attach_terminal(pid, wait, say)
    # Ctrl-C detaches, and the session's end interrupts input() with a SIGINT (see
    # _Session): an ignored SIGINT, inherited from whatever started us (a shell's
    # background job, a CI runner), would leave us in input() for good, deaf to the
    # server's bye.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _attach_terminal(pid, wait, say)
    finally:
        if previous is not None:  # None: not set from Python, nothing to put back
            signal.signal(signal.SIGINT, previous)


def _attach_terminal(pid: int | None, wait: float | None, say: Callable[[str], None]) -> int:
    try:
        path = choose_socket(pid, wait, say)
    except KeyboardInterrupt:
        return 130
    if path is None:
        return 1
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        send(conn, HELLO)
    except OSError as exc:
        conn.close()
        say(f"monarch-nb debug: cannot attach to {path}: {exc}\n")
        return 1
    return _Session(conn, say).run()


class _Session:
    """The client's two threads: one reads the server's messages; the main one shows
    them and reads the user's lines with ``input()`` (line editing, history). The
    end of the session (the server's bye, or the program's end) arriving while the
    user is at the prompt interrupts ``input()`` with a SIGINT to ourselves, so
    that readline restores the terminal as it does on Ctrl-C."""

    def __init__(self, conn: socket.socket, say: Callable[[str], None]) -> None:
        self.conn = conn
        self.say = say
        self.messages: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.ended: str | None = None  # why the server side ended, once it did
        self.in_input = False

    def _read(self) -> None:
        reader = LineReader(self.conn)
        try:
            while True:
                while not reader.pending():
                    if not reader.feed():
                        raise EOFError
                message = reader.take()
                if "bye" in message:
                    self._end(f"\n── {message['bye']} ──\n")
                    return
                self.messages.put(message)
        except (OSError, ValueError, EOFError):
            self._end(ENDED)

    def _end(self, why: str) -> None:
        self.ended = why
        self.messages.put({})
        if self.in_input:  # the main thread, in input(): its read must end (EINTR)
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def run(self) -> int:
        threading.Thread(target=self._read, name="monarch-nb-debug-reader", daemon=True).start()
        try:
            while True:
                message = self.messages.get()
                if self.ended is not None and not message:
                    self.say(self.ended)
                    return 0
                if "out" in message:
                    self.say(str(message["out"]))
                elif "prompt" in message:
                    self.in_input = True
                    try:
                        if self.ended is not None:
                            raise KeyboardInterrupt
                        line = input(str(message["prompt"]))
                    finally:
                        self.in_input = False
                    send(self.conn, {"line": line})
        except EOFError:
            self.say(DETACHED)
            return 0
        except KeyboardInterrupt:
            self.say(self.ended if self.ended is not None else DETACHED)
            return 0
        except OSError:
            self.say(self.ended or ENDED)
            return 0
        finally:
            self.conn.close()
