"""Ranks forked from a zygote: the controller's side (the zygote is ``_worker._zygote``).

A zygote is ``python -m monarch_nb.worker`` told to fork ranks rather than be
one. It imports a rank's modules once; each rank it forks shares their pages
(copy-on-write) and skips their import, which is most of a fresh rank's start.
Its ranks are its children, the controller's grandchildren: a
:class:`ForkedWorker` stands for one where a ``subprocess.Popen`` would (its
pid, stdout and stderr pipes, ``poll``/``wait``/``kill``), with a pidfd the
zygote handed over for watching its exit; the exit code comes from the zygote,
which keeps the exited rank a zombie until the code arrived here, so that its
pid names it while the controller may still kill its tree.

One zygote serves every mesh of this process whose ranks' interpreter and
import-time environment (``PYTHON*``, ``LD_*``, ``TMPDIR``, ``MONARCH_NB_*`` but
the per-mesh paths) are the same; it exits when its last rank has exited, so
nothing lingers once meshes stop, and the next start makes a fresh one. It dies
with this process (parent-death signal, from a thread that lives as long as it
does), and its ranks die with it; at exit this process ends it and reaps it
before it goes (:func:`stop_all`). Its socket is one end of a socketpair: no
other process can reach it; messages are JSON, never pickles.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import io
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from .._wire import _fd_messages

_log = logging.getLogger("monarch_nb")
ENV_VAR = "MONARCH_NB_ZYGOTE"  # "0": every rank a fresh interpreter
_PER_MESH = frozenset(
    {
        "MONARCH_NB_RUN_DIR",
        "MONARCH_NB_TREE_ROOT",
        "MONARCH_NB_DIST_FILE",
        "MONARCH_NB_TEST_SESSION",
    }
)
_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0  # at exit, for a zygote to go once told to
_MAX_MESSAGE = 1 << 16


def enabled(env: Mapping[str, str]) -> bool:
    """Whether local ranks fork from a zygote (the default) for this environment."""
    return env.get(ENV_VAR, os.environ.get(ENV_VAR, "1")).strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def _signature(python: str, env: Mapping[str, str]) -> tuple[Any, ...]:
    """What a rank's imports may have read: ranks that differ in it need their own zygote."""
    import_time = sorted(
        (k, v)
        for k, v in env.items()
        if (k.startswith(("PYTHON", "LD_", "MALLOC_", "MONARCH_NB_")) and k not in _PER_MESH)
        or k == "TMPDIR"
    )
    return (python, tuple(import_time))


class ZygoteError(RuntimeError):
    """The zygote could not start or fork a rank (the caller starts one fresh)."""


class ForkedWorker:
    """A rank forked by a zygote, as the launcher uses a ``subprocess.Popen``."""

    def __init__(self, pid: int, pidfd: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdin = None
        self.stdout: io.BufferedReader = open(stdout, "rb")  # noqa: SIM115 (the owner closes it)
        self.stderr: io.BufferedReader = open(stderr, "rb")  # noqa: SIM115
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._exited = threading.Event()

    def pidfd(self) -> int:
        """A new pidfd of the rank, for the caller to watch and close."""
        return os.dup(self._pidfd)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(["monarch_nb.worker"], timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # by pidfd: never another process, even if reaped
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _exit(self, code: int) -> None:
        self.returncode = code
        with contextlib.suppress(OSError):
            os.close(self._pidfd)
        self._pidfd = -1
        self._exited.set()


class Zygote:
    """One zygote process and the thread that started it and reads its reports."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.python = python
        self._sock, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()  # one fork request and its answer at a time
        self._answers: queue.Queue[ForkedWorker | str] = queue.Queue()
        self._children: dict[int, ForkedWorker] = {}
        self._pending: list[tuple[int, int]] = []  # the pipes of requests not answered yet
        self.closed = False
        self.pid = 0
        self.owner = os.getpid()
        self._popen: subprocess.Popen[bytes] | None = None
        ready = threading.Event()
        failure: list[BaseException] = []
        # The zygote's parent-death signal fires when the thread that forked it
        # ends: this thread lives as long as the zygote does.
        self._thread = threading.Thread(
            target=self._run,
            args=(dict(env), ready, failure),
            name="monarch_nb-zygote",
            daemon=True,
        )
        _every_zygote.add(self)
        self._thread.start()
        if not ready.wait(_READY_TIMEOUT_S) or failure:
            self._close()
            why = failure[0] if failure else f"not ready within {_READY_TIMEOUT_S} s"
            raise ZygoteError(f"the worker zygote did not start: {why}")

    def _run(
        self, env: dict[str, str], ready: threading.Event, failure: list[BaseException]
    ) -> None:
        popen: subprocess.Popen[bytes] | None = None
        try:
            popen = subprocess.Popen(
                [self.python, "-m", "monarch_nb.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,  # read once it ended: it writes only if it fails
                env=env,
                start_new_session=True,
                pass_fds=(self._theirs.fileno(),),
            )
            self._popen = popen
            boot = {"zygote": {"fd": self._theirs.fileno(), "parent": os.getpid()}}
            assert popen.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                popen.stdin.write(json.dumps(boot).encode() + b"\n")
                popen.stdin.close()
            self._theirs.close()
            first = self._read()
            if first is None or "ready" not in first[0]:
                raise ZygoteError(f"it exited ({popen.wait()})")
            self.pid = first[0]["ready"]
        except BaseException as exc:  # the caller starts its rank fresh, and says why if it fails
            self.closed = True
            self._sock.close()
            self._theirs.close()
            try:
                if popen is not None:
                    popen.kill()
                    said = b""
                    if popen.stderr is not None:
                        with popen.stderr:
                            said = popen.stderr.read()
                    popen.wait()
                    exc = ZygoteError(f"{exc} {said.decode(errors='replace').strip()}".strip())
            finally:
                failure.append(exc)
                ready.set()
            return
        ready.set()
        try:
            self._serve()
        finally:
            self._lost()
            said = b""
            if popen.stderr is not None:
                with popen.stderr:
                    said = popen.stderr.read()
            code = popen.wait()
            if code or said:
                _log.warning(
                    "monarch_nb: the worker zygote (pid %d) exited with code %d, and the "
                    "ranks it forked with it%s",
                    popen.pid,
                    code,
                    ": " + said.decode(errors="replace").strip() if said else "",
                )

    def _read(self) -> tuple[dict[str, Any], list[int]] | None:
        try:  # a report carries one descriptor at most: a forked rank's pidfd
            return _fd_messages.receive(self._sock, _MAX_MESSAGE, 1)
        except OSError:
            return None

    def _serve(self) -> None:
        while (message := self._read()) is not None:
            report, fds = message
            if "pid" in report:  # a fork answered: the request's pipes go with it
                out, err = self._pending.pop(0)
                child = ForkedWorker(report["pid"], fds[0], out, err)
                self._children[child.pid] = child
                self._answers.put(child)
            elif "error" in report:
                for fd in self._pending.pop(0):
                    os.close(fd)
                self._answers.put(str(report["error"]))
            elif "exit" in report:
                child = self._children.pop(report["exit"])
                child._exit(int(report["code"]))
                with contextlib.suppress(OSError):  # now the zygote may reap it
                    self._sock.sendmsg([json.dumps({"reap": child.pid}).encode()])
                self._close_if_idle()

    def _close_if_idle(self) -> None:
        # Not while a fork is asked for (its asker holds the lock): its rank is
        # about to join the children.
        if self._lock.acquire(blocking=False):
            try:
                if not self._children and not self.closed:
                    self.closed = True
                    with contextlib.suppress(OSError):
                        self._sock.shutdown(socket.SHUT_WR)  # the zygote exits at EOF
            finally:
                self._lock.release()

    def _lost(self) -> None:
        """The zygote is gone: its ranks died with it (their parent-death signal)."""
        self.closed = True
        for child in list(self._children.values()):
            child._exit(-signal.SIGKILL)
        self._children.clear()
        for pipes in self._pending:  # each asker waits for an answer
            for fd in pipes:
                os.close(fd)
            self._answers.put("the worker zygote exited")
        self._pending.clear()
        self._sock.close()

    def _close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def stop(self, timeout: float) -> None:
        """End the zygote now (ranks it still has die with it) and return once its
        thread has reaped it; killed if it is not gone within ``timeout`` s."""
        self._close()
        self._thread.join(timeout)
        if self._thread.is_alive() and self._popen is not None:
            with contextlib.suppress(OSError):
                self._popen.kill()
            self._thread.join(timeout)

    def fork(self, env: Mapping[str, str], bootstrap: Mapping[str, Any]) -> ForkedWorker:
        """A new rank with ``env``, this process's working directory and
        ``bootstrap``; raises :class:`ZygoteError` if the zygote cannot."""
        request = json.dumps(
            {"env": dict(env), "cwd": os.getcwd(), "boot": dict(bootstrap)}
        ).encode()
        with self._lock:
            if self.closed:
                raise ZygoteError("the worker zygote has exited")
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            self._pending.append((out_r, err_r))
            try:
                ancillary = [
                    (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_w, err_w]))
                ]
                self._sock.sendmsg([request], ancillary)
            except OSError as exc:
                self._pending.remove((out_r, err_r))
                for fd in (out_r, err_r):
                    os.close(fd)
                raise ZygoteError(f"could not ask the worker zygote for a rank: {exc}") from exc
            finally:
                os.close(out_w)
                os.close(err_w)
            try:
                answer = self._answers.get(timeout=_READY_TIMEOUT_S)
            except queue.Empty:
                self._close()  # a zygote that stopped answering serves no one
                raise ZygoteError(
                    f"the worker zygote (pid {self.pid}) did not answer within {_READY_TIMEOUT_S} s"
                ) from None
            if isinstance(answer, str) and not self._children and not self.closed:
                self.closed = True  # refused its first rank: it would only linger
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_WR)
        if isinstance(answer, str):
            raise ZygoteError(answer)
        return answer


_zygotes: dict[tuple[Any, ...], Zygote] = {}
_zygotes_lock = threading.Lock()
# Every zygote whose thread may still run, closed ones too (one that just lost
# its last rank is still exiting, and its thread still has to reap it).
_every_zygote: weakref.WeakSet[Zygote] = weakref.WeakSet()


def stop_all(timeout: float = _STOP_TIMEOUT_S) -> None:
    """End every zygote this process started and wait until each is reaped.

    At exit: a zygote's thread is a daemon, so the interpreter would otherwise
    leave without waiting for it, the zygote still running (its ``Popen`` then
    warns that it is) until its parent-death signal ends it."""
    for zygote in list(_every_zygote):
        if zygote.owner == os.getpid():  # not a forked copy's: its thread did not come along
            zygote.stop(timeout)


# Registered at import, so normally before the controller's exit handler, which
# then runs first (last registered, first run): it kills every mesh's ranks, and
# this one finds each zygote idle or exiting. Run the other way round, ranks die
# with their zygote (their parent-death signal) a moment sooner, as SIGKILLed.
atexit.register(stop_all)


def fork_worker(python: str, env: Mapping[str, str], bootstrap: Mapping[str, Any]) -> ForkedWorker:
    """A rank forked by the zygote for ``python`` and ``env``'s import-time
    settings, started first if there is none; raises :class:`ZygoteError`."""
    key = _signature(python, env)
    for _attempt in range(2):  # the zygote may close (its last rank gone) as we ask
        with _zygotes_lock:
            zygote = _zygotes.get(key)
            if zygote is None or zygote.closed:
                zygote = _zygotes[key] = Zygote(python, env)
        try:
            return zygote.fork(env, bootstrap)
        except ZygoteError:
            if not zygote.closed:
                raise
    raise ZygoteError("the worker zygote exited twice while asked for a rank")


def python_of(bootstrap: Mapping[str, Any]) -> str:
    return str(bootstrap.get("python") or sys.executable)
