"""The zygote: one pre-imported, single-threaded worker process that forks ranks.

Started as ``python -m monarch_nb.worker`` like any rank, with ``{"zygote":
...}`` for its bootstrap (see ``_services._zygote``, the controller's side). It
imports what a rank imports, freezes the garbage collector, and then waits on
the socket it inherited (a socketpair: nobody else can reach it) for requests:
each is one JSON message (a rank's environment, working directory and
bootstrap) with its stdout and stderr pipes attached (``SCM_RIGHTS``). It
forks; the child becomes the rank (:func:`serve` returns its bootstrap to
``_main.main``, which runs it as if it had been read from stdin), and the
zygote answers with the child's pid and a pidfd for it. When a child exits,
the zygote reports its exit code without reaping it, and reaps it when the
controller has the code (``reap``): until then its pid names no other process,
so the controller may still kill its tree (``_descendants.kill_tree``).

Why fork: a rank's imports cost about as much CPU as the rest of its start,
and each fresh interpreter keeps its own copy of every module it imported; a
forked rank shares them, copy-on-write, with the zygote and every other rank.
The zygote never unpickles: requests are JSON, from the one process that holds
the other end of its socketpair. It dies with that process (parent-death
signal), and its ranks die with it.
"""

from __future__ import annotations

import array
import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
from collections import deque
from typing import Any

from .._wire import _fd_messages
from .._wire._fd_limits import raise_fd_limit

_MAX_REQUEST = 1 << 20  # a request's JSON (an environment, a bootstrap): far below
_MAX_FDS = 2  # stdout, stderr


class _Outbox:
    """What the zygote tells the controller, in order, never blocking on it: the
    controller may be sending to us at the same moment (a fork request, a reap),
    and two senders each waiting for the other to read would wait forever (a
    thousand ranks stopping at once filled the socket both ways)."""

    def __init__(self, sock: socket.socket, poller: select.poll) -> None:
        self._sock = sock
        self._poller = poller
        self._queue: deque[tuple[bytes, list[int]]] = deque()

    def put(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        self._queue.append((json.dumps(message).encode(), fds or []))
        self.flush()

    def flush(self) -> None:
        while self._queue:
            data, fds = self._queue[0]
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            try:
                self._sock.sendmsg([data], rights, socket.MSG_DONTWAIT)
            except BlockingIOError:
                self._poller.modify(self._sock, select.POLLIN | select.POLLOUT)
                return
            self._queue.popleft()
        self._poller.modify(self._sock, select.POLLIN)


# The zygote's process name (``ps -o comm``, psutil's ``name()``): its command
# line is a rank's, so this is how tools tell it from its ranks, which get the
# interpreter's name back.
NAME = b"monarch_nb-zyg"
_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15


def _prctl(option: int, arg: Any) -> bool:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent(parent: int) -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(70)


def _own_name() -> bytes:
    try:
        with open("/proc/self/comm", "rb") as comm:
            return comm.read().strip()
    except OSError:
        return b"python"


def serve(config: dict[str, Any]) -> dict[str, Any]:
    """Serve fork requests until the controller closes the socket (then exit);
    returns only in a forked child, with its rank's bootstrap."""
    sock = socket.socket(fileno=config["fd"])
    _die_with_parent(config["parent"])
    raise_fd_limit()  # a pidfd per live rank: a thousand ranks pass the usual 1,024
    rank_name = _own_name()
    _prctl(_PR_SET_NAME, NAME)
    # What it imported is what a fresh rank imports at start, no more: a rank
    # imports the rest (cloudpickle, torch) when it needs it, as a fresh one would.
    # Pages holding the imported modules' objects stay shared: a collection in a
    # rank must not write every object's header (and copy its page).
    gc.collect()
    gc.freeze()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    cwd = os.getcwd()
    children: dict[int, int] = {}  # pidfd -> pid, not yet exited
    exited: dict[int, int] = {}  # pid -> pidfd, exited, reported, not yet reaped
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    outbox = _Outbox(sock, poller)
    outbox.put({"ready": os.getpid()})
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, mask in events:
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            elif fd == sock.fileno():
                if mask & select.POLLOUT:
                    outbox.flush()
                if not mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    continue
                message = _fd_messages.receive(sock, _MAX_REQUEST, _MAX_FDS)
                if message is None:  # the controller closed its end: our ranks die with us
                    os._exit(0)
                request, fds = message
                if "reap" in request:
                    pidfd = exited.pop(request["reap"], -1)
                    if pidfd >= 0:
                        with contextlib.suppress(ChildProcessError):
                            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
                        os.close(pidfd)
                    continue
                inherited = [wake_r, wake_w, *children, *exited.values()]
                try:
                    child = _fork(request, fds, outbox, inherited, (cwd, rank_name))
                except _Refused:
                    continue
                if child is None:
                    sock.close()
                    return _child_boot(request)
                pid, pidfd = child
                children[pidfd] = pid
                poller.register(pidfd, select.POLLIN)
            else:  # a child exited: its code, not yet reaped
                pid = children.pop(fd)
                poller.unregister(fd)
                result = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)
                code = _returncode(result) if result is not None else -signal.SIGKILL
                exited[pid] = fd
                outbox.put({"exit": pid, "code": code})


def _returncode(result: os.waitid_result) -> int:
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return -result.si_status  # killed (or dumped core) by signal si_status


class _Refused(Exception):
    """A request the zygote answered with an error: nothing to watch."""


def _refuse(outbox: _Outbox, fds: list[int], why: str) -> _Refused:
    for fd in fds:
        os.close(fd)
    outbox.put({"error": why})
    return _Refused(why)


def _fork(
    request: dict[str, Any],
    fds: list[int],
    outbox: _Outbox,
    inherited: list[int],
    was: tuple[str, bytes],
) -> tuple[int, int] | None:
    """Fork one rank; in the parent return (pid, pidfd) after answering the
    controller, in the child None once its process is set up as a rank's."""
    if len(fds) != _MAX_FDS:
        why = f"a fork request carries 2 pipes (stdout, stderr), not {len(fds)}"
        raise _refuse(outbox, fds, why)
    zygote = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        raise _refuse(outbox, fds, f"fork failed: {exc}") from None
    if pid == 0:
        _become_rank(request, fds, inherited, zygote, was)
        return None
    for fd in fds:
        os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)  # before any wait: the pid is ours until we reap it
    except OSError as exc:  # out of descriptors: this rank cannot be watched
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise _refuse(outbox, [], f"could not watch the forked rank: {exc}") from None
    outbox.put({"pid": pid}, [pidfd])
    return pid, pidfd


def _become_rank(
    request: dict[str, Any],
    fds: list[int],
    inherited: list[int],
    zygote: int,
    was: tuple[str, bytes],
) -> None:
    """In the forked child: what a fresh ``Popen(start_new_session=True)`` of the
    worker would have had, as far as the rank can tell."""
    try:
        zygote_cwd, rank_name = was
        os.setsid()
        _die_with_parent(zygote)
        _prctl(_PR_SET_NAME, rank_name)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:  # its wake-up pipe, its other children (the socket: serve())
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        # ``python -m`` puts the working directory first on the path.
        if sys.path and sys.path[0] == zygote_cwd:
            sys.path[0] = request["cwd"]
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(70)


def _child_boot(request: dict[str, Any]) -> dict[str, Any]:
    # The process whose death ends this rank (its wire thread's watch and its
    # parent-death signal) is its parent: the zygote, which dies with the controller.
    return dict(request["boot"], controller_pid=os.getppid())
