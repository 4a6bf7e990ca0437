"""``shell(hosts)``: an interactive shell on a one-host mesh, as Monarch's
``monarch.job.shell``.

The client spawns one process on the host, and in it an actor that starts
``$SHELL -i`` (``/bin/bash`` by default) on a new pseudo-terminal, in a
session of its own whose controlling terminal that is. Two channels of the
actors' signed transport carry the terminal: keystrokes and window sizes one
way, the terminal's output and finally the exit status the other. Nothing
listens on a port for it: the shell is reached only through the mesh, whose
messages carry the controller's key.

The local terminal is put in raw mode while the shell runs (keys such as
Ctrl-C go to the remote shell); end of input (Ctrl-D on an empty line is the
remote shell's, but closing the local input, e.g. a pipe, is ours) stops the
remote shell and what runs in its foreground: SIGHUP, then SIGTERM, then
SIGKILL, a second apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import stat
import struct
import sys
import termios
import tty
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .._model._errors import MeshUsageError
from .._runtime._actors import Actor, endpoint
from .._runtime._context import current_rank
from .._runtime._ports import Channel, Port, PortReceiver

_CHUNK = 16 * 1024
_GRACE_S = 1.0
_DEFAULT_SIZE = (24, 80)
# The messages: to the shell ("data", bytes), ("size", (rows, cols)), ("close",);
# from it ("data", bytes), ("exit", status), ("error", text).
_DATA, _SIZE, _CLOSE, _EXIT, _ERROR = "data", "size", "close", "exit", "error"

# Makes the pseudo-terminal (its stdin) the controlling terminal of the new
# session subprocess starts it in, then becomes the shell: job control and
# Ctrl-C work as in a local terminal. (A preexec_fn would do the same, but is
# unsafe in a process with threads, as every worker is.)
_TAKE_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def _is_dir(path: str) -> bool:
    return os.path.isdir(path)


def _set_size(fd: int, size: tuple[int, int]) -> None:
    rows, columns = size
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _size_of(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return _DEFAULT_SIZE
    return size.lines, size.columns


def exit_status(returncode: int) -> int:
    """A shell's status as a shell reports it: 128 + N when killed by signal N."""
    return returncode if returncode >= 0 else min(128 - returncode, 255)


def _rank_environment() -> dict[str, str]:
    point = current_rank()
    env = {f"MONARCH_RANK_{name}": str(index) for name, index in dict(point).items()}
    env.update({f"MONARCH_SIZE_{name}": str(size) for name, size in point.extent.items()})
    return env


async def _stop_shell(master: int, process: asyncio.subprocess.Process) -> None:
    """Hang up on the shell and its foreground job, then insist."""
    groups = {process.pid}
    with contextlib.suppress(OSError):
        groups.add(os.tcgetpgrp(master))
    groups.discard(os.getpgrp())  # never signal the worker's own group
    groups = {g for g in groups if g > 1}
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), _GRACE_S)
        groups = {g for g in groups if _group_alive(g)}
        if not groups and process.returncode is not None:
            return
    await process.wait()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class ShellSession(Actor):
    """On the host: one shell on a pseudo-terminal, fed and read through channels."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._master: int | None = None
        self._session: asyncio.Future[None] | None = None

    @endpoint
    async def start(
        self,
        output: Port[Any],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        term: str,
        size: tuple[int, int],
    ) -> Port[Any]:
        """Start the shell; its output goes to ``output``; returns the port for its input."""
        if self._process is not None:
            raise RuntimeError("this shell session is already running; spawn another actor")
        to_shell, incoming = Channel[Any].open()
        master, slave = os.openpty()
        child_env = {**os.environ, **_rank_environment(), **(env or {}), "TERM": term}
        cwd = workdir or (client_cwd if _is_dir(client_cwd) else None)
        try:
            _set_size(master, size)
            program = child_env.get("SHELL") or "/bin/bash"
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _TAKE_TERMINAL,
                program,
                "-i",
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=child_env,
                start_new_session=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self._process, self._master = process, master
        self._session = asyncio.ensure_future(self._run(process, master, incoming, output))
        return to_shell

    async def _run(
        self,
        process: asyncio.subprocess.Process,
        master: int,
        incoming: PortReceiver[Any],
        output: Port[Any],
    ) -> None:
        reading = asyncio.ensure_future(self._copy_output(master, process, output))
        writing = asyncio.ensure_future(self._copy_input(incoming, master, process))
        try:
            done, _ = await asyncio.wait({reading, writing}, return_when=asyncio.FIRST_COMPLETED)
            if reading not in done:
                writing.result()
            await reading
        except Exception as error:
            with contextlib.suppress(Exception):
                output.send((_ERROR, f"{type(error).__name__}: {error}"))
            await _stop_shell(master, process)
        finally:
            for task in (reading, writing):
                task.cancel()
            await asyncio.gather(reading, writing, return_exceptions=True)
            incoming.close()

    @staticmethod
    async def _copy_output(
        master: int, process: asyncio.subprocess.Process, output: Port[Any]
    ) -> None:
        async for data in _chunks(master):
            output.send((_DATA, data))
        output.send((_EXIT, exit_status(await process.wait())))

    @staticmethod
    async def _copy_input(
        incoming: PortReceiver[Any], master: int, process: asyncio.subprocess.Process
    ) -> None:
        while process.returncode is None:
            message = await incoming.recv()
            if message[0] == _DATA:
                await _write_all(master, message[1])
            elif message[0] == _SIZE:
                _set_size(master, message[1])
            else:  # the client's input ended
                await _stop_shell(master, process)
                return

    async def __cleanup__(self, exc: Exception | None) -> None:
        process, master = self._process, self._master
        if process is not None and master is not None and process.returncode is None:
            await _stop_shell(master, process)
        if self._session is not None:
            self._session.cancel()
            await asyncio.gather(self._session, return_exceptions=True)
        if self._master is not None:
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = None


async def _chunks(fd: int) -> AsyncIterator[bytes]:
    """What ``fd`` yields until its end (EIO: a pseudo-terminal whose other side
    is closed). A regular file is read directly: it cannot be waited on."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        while data := os.read(fd, _CHUNK):
            yield data
        return
    loop = asyncio.get_running_loop()
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_reader(fd)
                continue
            except OSError as error:
                if error.errno == errno.EIO:
                    return
                raise
            if not data:
                return
            yield data
    finally:
        os.set_blocking(fd, blocking)


async def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to a non-blocking or blocking ``fd``, waiting while it is full;
    a closed reader raises BrokenPipeError."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_writer(fd, ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_writer(fd)


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The local terminal in raw mode (every key to the remote shell), if it is one."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: keys typed ahead reach the shell
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _non_blocking(fd: int) -> Iterator[None]:
    blocking = os.get_blocking(fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.set_blocking(fd, False)
    try:
        yield
    finally:
        os.set_blocking(fd, blocking)


@contextlib.contextmanager
def _on_resize(notify: Callable[[], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGWINCH, notify)
    except (RuntimeError, ValueError):  # not the main thread: sizes stay as they were
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGWINCH)


async def _terminal(
    to_shell: Port[Any], from_shell: PortReceiver[Any], stdin: int, stdout: int
) -> int:
    """Copy the local terminal to the shell and back; its exit status."""

    async def send_input() -> None:
        try:
            async for data in _chunks(stdin):
                to_shell.send((_DATA, data))
        finally:
            with contextlib.suppress(Exception):
                to_shell.send((_CLOSE,))

    async def show_output() -> int:
        # In raw mode the cursor may sit mid-line: the shell's first prompt starts
        # at the left. (This first write also fails at once on a closed output.)
        await _write_all(stdout, b"\r")
        while True:
            message = await from_shell.recv()
            if message[0] == _DATA:
                await _write_all(stdout, message[1])
            elif message[0] == _EXIT:
                return int(message[1])
            else:
                raise RuntimeError(f"the remote shell failed: {message[1]}")

    with (
        _raw(stdin),
        _non_blocking(stdout),
        _on_resize(lambda: to_shell.send((_SIZE, _size_of(stdin)))),
    ):
        sending = asyncio.ensure_future(send_input())
        showing = asyncio.ensure_future(show_output())
        try:
            done, _ = await asyncio.wait({sending, showing}, return_when=asyncio.FIRST_COMPLETED)
            if sending in done:
                sending.result()  # input failed: raise that; its end is not an error
            return await showing
        finally:
            for task in (sending, showing):
                task.cancel()
            await asyncio.gather(sending, showing, return_exceptions=True)


async def _shell(hosts: Any, env: dict[str, str] | None, workdir: str | None) -> int:
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    with contextlib.suppress(Exception):
        sys.stdout.flush()  # what Python printed before comes first
    to_client, from_shell = Channel[Any].open()
    procs = hosts.spawn_procs()
    try:
        session = procs.spawn("shell", ShellSession)
        to_shell = await session.start.call_one(
            to_client,
            env,
            workdir,
            os.getcwd(),
            os.environ.get("TERM", "xterm-256color"),
            _size_of(stdin),
        )
        return await _terminal(to_shell, from_shell, stdin, stdout)
    finally:
        from_shell.close()
        await procs.stop()


def shell(
    host_mesh_singleton: Any, *, env: dict[str, str] | None = None, workdir: str | None = None
) -> int:
    """Run an interactive shell on a one-host mesh, in this terminal; its exit status.

    ``env`` adds variables to the remote shell's environment (which also has
    ``MONARCH_RANK_<dim>`` and ``MONARCH_SIZE_<dim>``); ``workdir`` is where it
    starts (default: this directory, if the host has it). The shell runs in a
    process of its own on the host, stopped when the shell ends. From a
    notebook there is no terminal: use a terminal, or ``%%mesh`` cells.
    """
    if host_mesh_singleton.size() != 1:
        raise ValueError(
            "shell requires a singleton HostMesh (one host), got "
            f"{host_mesh_singleton.size()} hosts: slice it first, e.g. hosts.slice(hosts=0)"
        )
    for stream in (sys.stdin, sys.stdout):
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            raise MeshUsageError(
                f"shell() needs this process's stdin and stdout to be files (a terminal, "
                f"pipes); {stream!r} is not one, as in a notebook: run it from a terminal, "
                "or use %%mesh cells and procs.run() there"
            ) from None
    return asyncio.run(_shell(host_mesh_singleton, env, workdir))
