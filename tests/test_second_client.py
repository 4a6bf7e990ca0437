"""A mesh reference pickled into a second client process (another process tree).

Monarch's test_client_hard_exit_cleanup passes a ProcMesh to a process started
with multiprocessing's "spawn", which is a client of its own. Its ranks check
every message against the key of the tree that started them, so here that
second client cannot use the reference: it must be told so at once (not wait
forever on calls whose messages the ranks drop), while the meshes it starts
itself work, and end with it when it is killed.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from process_checks import wait_for_exit

from monarch_nb import Actor, RemoteError, endpoint, this_host

# The second client: reads the pickled meshes on stdin, reports each step as
# one JSON line, and waits to be killed.
_CLIENT = textwrap.dedent(
    """
    import json, os, pickle, sys, time
    from monarch_nb import Actor, MeshUsageError, endpoint, this_host

    class Own(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    def say(**kw):
        print(json.dumps(kw), flush=True)

    procs, actors = pickle.loads(sys.stdin.buffer.read())
    for what, use in (
        ("spawn", lambda: procs.spawn("theirs", Own)),
        ("call", lambda: actors.pid.call_one().get(timeout=60)),
    ):
        try:
            use()
            say(step=what, error=None)
        except MeshUsageError as exc:
            say(step=what, error=str(exc))
    mine = this_host().spawn_procs(per_host={"procs": 1})
    say(step="own", pid=mine.spawn("own", Own).pid.call_one().get(timeout=60))
    time.sleep(600)
    """
)


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def client() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLIENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=False,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    assert proc.stdout is not None
    proc.stdout.close()


def _line(proc: subprocess.Popen) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the client runs under the test's timeout
    assert line, f"the second client exited early (code {proc.poll()})"
    return json.loads(line)


def test_a_second_client_is_refused_a_reference_at_once_and_its_own_procs_end_with_it(
    client: subprocess.Popen,
) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actors = procs.spawn("ours", Pid)
        ours = actors.pid.call_one().get(timeout=60)
        assert client.stdin is not None
        client.stdin.write(pickle.dumps((procs, actors)))
        client.stdin.close()

        for step in ("spawn", "call"):
            said = _line(client)
            assert said["step"] == step
            assert said["error"]
            assert "belongs to another monarch_nb client" in said["error"]
            assert "'procs'" in said["error"]
            assert "this_host().spawn_procs" in said["error"]

        own = _line(client)
        assert own["step"] == "own"
        assert own["pid"] != ours
        # Killed without any chance to clean up, as Monarch's test does.
        client.send_signal(signal.SIGTERM)
        assert client.wait(60) == -signal.SIGTERM
        assert not wait_for_exit({own["pid"]}, 60), "the second client's rank outlived it"

        # The first client's mesh is untouched.
        assert actors.pid.call_one().get(timeout=60) == ours
    finally:
        procs.stop().get(timeout=60)


# A second client as multiprocessing makes it: a script whose main block starts
# a process with "spawn", where the script's classes live in `__mp_main__`.
_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, sys
    from monarch_nb import Actor, endpoint, this_host

    class Own(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    def child(queue):
        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            queue.put(procs.spawn("own", Own).pid.call_one().get(timeout=60))
        except Exception as exc:
            queue.put(f"{type(exc).__name__}: {exc}")
        finally:
            procs.stop().get(timeout=60)

    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        print(queue.get(timeout=120), flush=True)
        process.join(60)
        sys.exit(process.exitcode)
    """
)


def test_a_client_started_by_multiprocessing_spawns_the_actors_its_script_defines(
    tmp_path,
) -> None:
    script = tmp_path / "second_client.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().isdigit(), done.stdout + done.stderr[-2000:]


class _MissingOnRanks:
    """Pickles fine here; unpickling it on a rank raises KeyError (a name its
    environment lacks), as a class of a module the ranks cannot import does."""

    def __reduce__(self):
        return (os.environ.__getitem__, ("MONARCH_NB_TEST_NOT_ON_RANKS",))


def test_calls_to_an_actor_whose_spawn_did_not_unpickle_say_so(procs2) -> None:
    actors = procs2.spawn("unmade", Pid, _MissingOnRanks())
    with pytest.raises(Exception, match="could not be unpickled"):
        actors.initialized.get(timeout=60)
    with pytest.raises(RemoteError) as raised:
        actors.pid.call().get(timeout=60)
    assert "could not be unpickled" in str(raised.value)
    assert "KeyError" in str(raised.value)
    assert "never made" in str(raised.value)
    assert "no actor" not in str(raised.value)
