"""shell(): a terminal on a one-host mesh, driven as a user would.

The client runs in a process of its own: under a real pseudo-terminal that is
its controlling terminal (raw mode, window sizes, Ctrl-C), or with pipes for
input and output (end of input, a closed output). Every test checks that the
remote shell and what it started are gone afterwards.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path

import psutil
import pytest

WAIT_S = 60

CLIENT = textwrap.dedent(
    """
    import os, sys, termios
    from monarch_nb import this_host
    from monarch_nb.job import shell
    status = shell(this_host(), env={"NB_SHELL_TEST": "connected"}, workdir=sys.argv[1])
    if os.isatty(0):
        echo = bool(termios.tcgetattr(0)[3] & termios.ECHO)
        print(f"\\r\\nlocal terminal restored: {echo}", flush=True)
    sys.exit(status)
    """
)

# Makes the pseudo-terminal the client's controlling terminal, as a login would.
TAKE_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """The master side of the client's pseudo-terminal: type, and wait for text."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.seen = b""

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, text: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; the terminal showed:\n{self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the client closed the terminal
                    chunk = b""
                if not chunk:
                    assert text.encode() in self.seen, f"terminal closed before {text!r}"
                self.seen += chunk

    def read_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.master], [], [], left)[0]:
                self.seen += os.read(self.master, 65536)

    def drain(self) -> None:
        """Read what is left until the client closes the terminal."""
        while True:
            ready, _, _ = select.select([self.master], [], [], WAIT_S)
            try:
                chunk = os.read(self.master, 65536) if ready else b""
            except OSError:
                return
            if not chunk:
                return
            self.seen += chunk


def assert_gone(pid: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    assert not psutil.pid_exists(pid), f"process {pid} outlived the shell"


def test_a_terminal_shell_runs_raw_resizes_and_returns_its_status(tmp_path: Path) -> None:
    master, slave = os.openpty()
    set_size(slave, 33, 101)
    client = subprocess.Popen(
        [sys.executable, "-c", TAKE_TERMINAL, "-c", CLIENT, str(tmp_path)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        env={**os.environ, "SHELL": "/bin/bash", "PS1": "remote$ "},
    )
    os.close(slave)
    term = Terminal(master)
    try:
        # The remote shell sees this terminal's size, the test's variable, its
        # rank, and starts where it was told to.
        term.type('echo "[$NB_SHELL_TEST:$MONARCH_RANK_procs:$(stty size):$PWD]"\n')
        term.expect(f"[connected:0:33 101:{tmp_path}]")
        # A resize of the local terminal reaches the remote one.
        set_size(master, 40, 120)
        # The new size travels on its own (SIGWINCH, then a message), beside the
        # keys: ask until the remote terminal has it.
        deadline = time.monotonic() + WAIT_S
        while b"<40 120>" not in term.seen:
            assert time.monotonic() < deadline, term.seen[-2000:]
            term.type('echo "<$(stty size)>"\n')
            term.read_for(0.5)
        # Raw mode: Ctrl-C reaches the remote foreground job, not the client.
        pid_file = tmp_path / "sleeper"
        term.type(f"sh -c 'echo $$ > {pid_file}; exec sleep 60'\n")
        deadline = time.monotonic() + WAIT_S
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, term.seen[-2000:]
            time.sleep(0.05)
        sleeper = int(pid_file.read_text())
        term.type("\x03")
        assert_gone(sleeper)
        term.type('echo "still $((6 * 7))"\n')
        term.expect("still 42")
        term.type("exit 3\n")
        term.drain()
        assert client.wait(WAIT_S) == 3
        assert b"local terminal restored: True" in term.seen
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        os.close(master)


def run_with_pipes(script: str, tmp_path: Path, close_after: Path | None = None) -> tuple:
    """The client with pipes for stdin/stdout; ``script`` is typed, and the input
    closed once ``close_after`` exists (else left open until the client ends)."""
    errors = (tmp_path / "stderr").open("wb")
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        env={**os.environ, "SHELL": "/bin/bash"},
    )
    assert client.stdin is not None
    assert client.stdout is not None
    client.stdin.write(script.encode())
    client.stdin.flush()
    started = time.monotonic()
    if close_after is not None:
        while not close_after.exists() and client.poll() is None:
            assert time.monotonic() - started < WAIT_S, f"{close_after} never appeared"
            time.sleep(0.05)
        client.stdin.close()
    try:
        out = client.stdout.read()  # until the client ends: its output closes
        client.wait(WAIT_S)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        if not client.stdin.closed:
            client.stdin.close()
        client.stdout.close()
        errors.close()
    err = (tmp_path / "stderr").read_text(errors="replace")
    return client.returncode, out.decode(errors="replace"), err


def test_piped_input_and_its_end_stops_the_shell_and_its_foreground_job(tmp_path: Path) -> None:
    pid_file = tmp_path / "child"
    started = time.monotonic()
    status, out, err = run_with_pipes(
        'printf "got:%s:%s:%s\\n" "$NB_SHELL_TEST" "$MONARCH_SIZE_procs" "$$"\n'
        f"sh -c 'echo $$ > {pid_file}; exec sleep 60'\n",
        tmp_path,
        close_after=pid_file,
    )
    assert pid_file.exists(), err
    assert status == 129, err  # hung up on: 128 + SIGHUP, as a shell reports it
    assert time.monotonic() - started < WAIT_S
    line = next(line for line in out.splitlines() if line.startswith("got:"))
    _, variable, size, shell_pid = line.strip().split(":")
    assert (variable, size) == ("connected", "1")
    assert_gone(int(pid_file.read_text()))
    assert_gone(int(shell_pid))


def test_a_closed_output_fails_the_client(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    script = (
        "import sys\ntry:\n"
        + textwrap.indent(CLIENT, "    ")
        + ("\nexcept BrokenPipeError:\n    sys.stderr.write('BrokenPipeError')\n    sys.exit(9)\n")
    )
    client = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        input=b"echo hi\nexit\n",
        stdout=write_end,
        stderr=subprocess.PIPE,
        timeout=WAIT_S,
        env={**os.environ, "SHELL": "/bin/bash"},
        check=False,
    )
    os.close(write_end)
    assert client.returncode == 9, client.stderr.decode(errors="replace")


def test_shell_wants_one_host() -> None:
    from monarch_nb import ssh_hosts
    from monarch_nb.job import shell

    local_ssh = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")
    with ssh_hosts(["h0", "h1"], ssh=local_ssh, bind="127.0.0.1") as hosts:
        with pytest.raises(ValueError, match="singleton HostMesh"):
            shell(hosts)
        assert hosts.slice(hosts=0).size() == 1


def test_without_a_terminal_or_pipes_the_shell_says_so(monkeypatch) -> None:
    import io

    from monarch_nb import MeshUsageError, this_host
    from monarch_nb.job import shell

    monkeypatch.setattr(sys, "stdin", io.StringIO("exit\n"))  # as a notebook's stdin
    with pytest.raises(MeshUsageError, match="run it from a terminal"):
        shell(this_host())
