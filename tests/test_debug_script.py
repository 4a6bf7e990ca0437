"""breakpoint() on a rank of a plain script, with no monarch_nb.debug.install().

Real terminals (pseudo-terminals): a script whose stdin is one prompts there;
a script whose stdin is not waits for ``monarch-nb debug``, run here on a
terminal of its own, and refuses connections that are not its user's or do
not say hello, without stalling.
"""

from __future__ import annotations

import glob
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

DEADLINE_S = 60.0  # for each awaited output: the machine's cores are shared

SCRIPT = """\
import os, time
from monarch_nb import Actor, endpoint, current_rank, this_host

class Trainer(Actor):
    @endpoint
    def step(self, x, flag=None):
        loss = x * (current_rank().rank + 1)
        # Rank 1 pauses once rank 0, paused first, made the flag (a pdb command):
        # the first prompt is rank 0's.
        while flag and current_rank().rank == 1 and not os.path.exists(flag):
            time.sleep(0.01)
        if x == 7:
            import pdb  # imported on the rank after start: its set_trace is the remote one
            pdb.set_trace()
        else:
            breakpoint()
        return loss

with this_host().spawn_procs(per_host={"procs": 2}, echo_output=False) as procs:
    trainers = procs.spawn("trainers", Trainer)
    # One write each: the debugger thread writes to the same terminal meanwhile.
    first = trainers.step.call(5, os.path.abspath("rank0-paused")).get(timeout=300)
    print(f"first {sorted(first.values())}", flush=True)
    print(f"second {trainers.slice(procs=0).step.call_one(7).get(timeout=300)}", flush=True)
print("done", flush=True)
"""


# Runs the rest of its argv with SIGINT ignored (inherited across exec).
IGNORING_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execvp(sys.argv[1], sys.argv[1:])",
]


class Terminal:
    """A process on a pseudo-terminal: what it wrote, and lines typed to it."""

    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        *,
        stdin_is_terminal: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.master, slave = os.openpty()
        self.text = ""
        self.proc = subprocess.Popen(
            argv,
            stdin=slave if stdin_is_terminal else subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            start_new_session=True,  # the terminal is its controlling one
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        )
        os.close(slave)

    def _pump(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                chunk = b""
            if chunk:
                self.text += chunk.decode(errors="replace").replace("\r\n", "\n")
            else:
                time.sleep(0.05)

    def expect(self, needle: str, start: int = 0) -> int:
        """Wait for ``needle`` in the output from ``start``; returns the index after it."""
        deadline = time.monotonic() + DEADLINE_S
        while needle not in self.text[start:]:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} within {DEADLINE_S} s in:\n{self.text}")
            ended = self.proc.poll() is not None
            before = len(self.text)
            self._pump(0.2)
            if ended and len(self.text) == before:
                raise AssertionError(f"no {needle!r}: it exited, having written:\n{self.text}")
        return self.text.index(needle, start) + len(needle)

    def mark(self) -> int:
        return len(self.text)

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def wait(self) -> int:
        deadline = time.monotonic() + DEADLINE_S
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {DEADLINE_S} s:\n{self.text}")
            self._pump(0.2)
        self._pump(0.1)
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its session: the script and its ranks
            self.proc.wait(timeout=30)
        os.close(self.master)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def test_a_script_on_a_terminal_prompts_there(script, terminals):
    run = Terminal([sys.executable, str(script)], script.parent)
    terminals.append(run)
    run.expect("── rank 0 paused at ")
    at = run.expect("(Pdb rank 0) ")
    run.send("p loss")
    at = run.expect("\n5\n", at)
    run.send("!open(flag, 'w').close()")  # rank 1 may pause now
    listed = ""
    while "  rank 1: " not in listed:  # `ranks` until rank 1 is listed as paused too
        run.send("ranks")
        table = run.expect("* rank 0: ", at)
        at = run.expect("(Pdb rank 0) ", table)
        listed = run.text[table:at]
    at = run.mark()
    run.send("cast 0-1 p loss * 10")
    run.expect("[0] 50\n", at)
    run.expect("[1] 100\n", at)
    run.send("continue all")
    at = run.expect("first [5, 10]", at)
    # A second pause of the same rank: its header again (issue 62 item 11).
    run.expect("── rank 0 paused at ", at)
    run.expect("(Pdb rank 0) ", at)
    run.send("c")
    run.expect("second 7", at)
    run.expect("done", at)
    assert run.wait() == 0, run.text


def _connect_as(uid: int, path: str) -> str:
    """What a process of another user gets when it connects to ``path``."""
    code = (
        "import os, socket, sys\n"
        f"os.setgid({uid}); os.setuid({uid})\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect({path!r})\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=DEADLINE_S
    )
    return out.stdout.strip() or out.stderr


@pytest.fixture
def own_tmpdir() -> Iterator[dict[str, str]]:
    """An environment whose programs only see each other's debug sockets.

    ``monarch-nb debug`` without ``--pid`` looks at every program of this user
    (in the temporary directory and ``XDG_RUNTIME_DIR``) and attaches only if
    one is paused: any other paused program on the machine (another test run,
    someone's script) makes it list them and exit, as it should. A temporary
    directory of our own (short: the run directory's socket paths must fit in
    108 bytes) makes "the only paused program" true here whatever else runs.
    The script inherits its run directory, as one started from a kernel does.
    """
    private = tempfile.mkdtemp(prefix="nbd")
    inherited = os.path.join(private, "monarch_nb-run-inherited")
    os.mkdir(inherited, 0o700)
    env = {
        k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "MONARCH_NB_TREE_ROOT")
    }
    env["TMPDIR"] = private
    env["MONARCH_NB_RUN_DIR"] = inherited
    yield env
    shutil.rmtree(private, ignore_errors=True)


def test_a_script_without_a_terminal_waits_for_monarch_nb_debug(
    script, terminals, request, own_tmpdir
):
    from monarch_nb.debug._attach import SOCKET_GLOB, socket_name

    env = own_tmpdir
    run = Terminal([sys.executable, str(script)], script.parent, stdin_is_terminal=False, env=env)
    terminals.append(run)
    run.expect("this script's stdin is not a terminal: attach from another one")
    assert "monarch_nb: rank(s) 0 paused (rank 0 at " in run.text
    assert f"`python -m monarch_nb debug --pid {run.proc.pid}`" in run.text
    sockets = glob.glob(os.path.join(env["TMPDIR"], SOCKET_GLOB))
    assert [os.path.basename(p) for p in sockets] == [socket_name(run.proc.pid)], sockets
    path = sockets[0]
    assert (os.stat(os.path.dirname(path)).st_mode & 0o777) == 0o700

    # Another user cannot even reach the socket.
    if os.getuid() == 0:
        assert _connect_as(65534, path) == "PermissionError"
    # Connections of our own user that never say hello, or say something else,
    # stall nothing: one stays open, silent, through the whole session.
    silent = socket.socket(socket.AF_UNIX)
    request.addfinalizer(silent.close)  # a failure below must not leak it into later tests
    silent.connect(path)
    rude = socket.socket(socket.AF_UNIX)
    rude.connect(path)
    rude.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 100_000)
    rude.settimeout(DEADLINE_S)
    try:
        answer = rude.recv(4096)
    except ConnectionResetError:  # closed with our bytes unread
        answer = b""
    assert answer == b""  # closed, nothing said
    rude.close()

    command = shutil.which("monarch-nb")
    argv = [command] if command else [sys.executable, "-m", "monarch_nb"]
    client = Terminal([*argv, "debug", "--pid", str(run.proc.pid)], script.parent, env=env)
    terminals.append(client)
    client.expect(f"attached to pid {run.proc.pid}")
    client.expect("── rank 0 paused at ")
    at = client.expect("(Pdb rank 0) ")
    client.send("p loss")
    at = client.expect("\n5\n", at)
    client.send("!open(flag, 'w').close()")  # rank 1 may pause now
    listed = ""
    while "  rank 1: " not in listed:  # `ranks` until rank 1 is listed as paused too
        client.send("ranks")
        table = client.expect("* rank 0: ", at)
        at = client.expect("(Pdb rank 0) ", table)
        listed = client.text[table:at]
    at = client.mark()
    client.send("cast 0-1 p loss * 10")
    client.expect("[1] 100\n", at)
    client.expect("(Pdb rank 0) ", at)
    os.write(client.master, b"\x04")  # Ctrl-D: detach, the ranks stay paused
    client.expect("detached; the ranks stay paused")
    assert client.wait() == 0, client.text
    assert "first" not in run.text

    # The only paused program: no --pid. Started with SIGINT ignored, as the child of
    # a shell's background job is (a CI runner's): the take-over below must still
    # end its input() (the client interrupts it with a SIGINT of its own).
    again = Terminal([*IGNORING_SIGINT, *argv, "debug"], script.parent, env=env)
    terminals.append(again)
    again.expect("── rank 0 paused at ")
    at = again.expect("(Pdb rank 0) ")
    again.send("attach 1")
    again.expect("(Pdb rank 1) ", again.expect("── rank 1 paused at ", at))

    third = Terminal([*argv, "debug"], script.parent, env=env)  # takes over, as Monarch's does
    terminals.append(third)
    try:
        again.expect("another client attached; this one is detached")
    except AssertionError as exc:  # what the third client saw tells why
        third._pump(1.0)
        run._pump(1.0)
        raise AssertionError(
            f"{exc}\nthe third client wrote:\n{third.text}\nthe script wrote:\n{run.text}"
        ) from None
    assert again.wait() == 0, again.text
    at = third.expect("(Pdb rank 1) ", third.expect("── rank 1 paused at "))
    third.send("continue all")
    # The second call pauses rank 0 again: the same client is given it.
    at = third.expect("── rank 0 paused at ", at)
    third.send("c")
    third.expect("the program ended", at)
    assert third.wait() == 0, third.text
    assert run.wait() == 0, run.text
    assert "first [5, 10]" in run.text
    assert "second 7" in run.text
    # Its socket went with it, though the run directory stays: a later process
    # given its pid is not listed as a paused program.
    assert glob.glob(os.path.join(env["TMPDIR"], SOCKET_GLOB)) == []
    silent.close()
