"""A keyless connection flood on an agent's ``--listen`` port, performed for real.

The attack: ~1,100 TCP connections to the agent's CURVE endpoint, each sending
a ZMTP greeting that asks for CURVE and then waiting, reopened as soon as the
agent drops one, against an agent whose fd limit is 1,024 (soft and hard, as
``ulimit -n 1024`` sets them, so raising the soft limit does not help). Before
the handshake guard the agent accepted them all, ran out of fds and died on
its next heartbeat, SIGKILLing its ranks. What must hold: the attached 2-rank
mesh answers every call made during the flood, and the agent lives.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from process_checks import wait_for_exit

from monarch_nb import attach

FD_LIMIT = 1024
CONNECTIONS = 1100
FLOOD_S = 8.0  # longer than the listening socket's handshake deadline (5 s)
MAX_OPENS = 40_000  # reopenings, all told: the flood is bounded in work too

# Starts the agent with RLIMIT_NOFILE lowered, soft and hard, then becomes it
# (exec: the process keeps the agent's command line, which the leak checks find).
_LIMITED = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)

_FLOOD = textwrap.dedent(
    """
    import json, resource, selectors, socket, sys, time

    port, count, max_opens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
    seconds = float(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # A ZMTP 3.0 greeting asking for CURVE: then nothing, as a client without the key.
    GREETING = b"\\xff" + bytes(8) + b"\\x7f" + bytes([3, 0])
    GREETING += b"CURVE".ljust(20, b"\\0") + bytes(32)
    selector = selectors.DefaultSelector()
    stats = dict(opened=0, established=0, dropped=0, failed=0, peak=0)
    live = 0

    def open_one():
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        selector.register(s, selectors.EVENT_WRITE, False)
        stats["opened"] += 1

    def drop(s, established):
        global live
        selector.unregister(s)
        s.close()
        if established:
            live -= 1
            stats["dropped"] += 1
        else:
            stats["failed"] += 1
        if stats["opened"] < max_opens and time.monotonic() < deadline:
            open_one()

    deadline = time.monotonic() + seconds
    for _ in range(count):
        open_one()
    print("flooding", flush=True)
    while time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.1):
            s, established = key.fileobj, key.data
            if not established:  # the connect finished, or failed
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    drop(s, False)
                    continue
                try:
                    s.send(GREETING)
                except OSError:
                    drop(s, False)
                    continue
                selector.modify(s, selectors.EVENT_READ, True)
                live += 1
                stats["established"] += 1
                stats["peak"] = max(stats["peak"], live)
                continue
            try:
                data = s.recv(4096)  # the agent's greeting, or the end
            except OSError:
                data = b""
            if not data:
                drop(s, True)
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    print(json.dumps(stats), flush=True)
    """
)


def _start_limited_agent(key_file, log_path) -> tuple[subprocess.Popen, int]:
    """A listening agent with RLIMIT_NOFILE at FD_LIMIT; its port once it listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "monarch_nb.agent", "--listen", f"tcp://127.0.0.1:{port}"]
    argv += ["--key-file", str(key_file)]
    with open(log_path, "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-c", _LIMITED, str(FD_LIMIT), *argv], stderr=log, stdout=log
        )
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return agent, port
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            agent.wait(10)
            raise AssertionError(f"the agent never listened (exit code {agent.poll()})")
        time.sleep(0.05)


def test_a_keyless_connection_flood_leaves_an_attached_mesh_answering(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < CONNECTIONS + 200:
        pytest.skip(f"the flood needs {CONNECTIONS + 200} fds of its own")
    key_file = tmp_path / "agent.key"
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", str(key_file)], check=True)
    log_path = tmp_path / "agent.log"
    agent, port = _start_limited_agent(key_file, log_path)
    flood = hosts = procs = None
    try:
        assert psutil.Process(agent.pid).rlimit(psutil.RLIMIT_NOFILE) == (FD_LIMIT, FD_LIMIT)
        hosts = attach([f"tcp://127.0.0.1:{port}"], key_file=str(key_file))
        procs = hosts.spawn_procs({"procs": 2})
        workers = set(procs.pids)
        assert procs.run("rank").values() == [0, 1]

        flood_args = [str(port), str(CONNECTIONS), str(FLOOD_S), str(MAX_OPENS)]
        flood = subprocess.Popen(
            [sys.executable, "-c", _FLOOD, *flood_args],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "flooding"
        calls = failures = 0
        errors: list[str] = []
        while flood.poll() is None:
            try:
                assert procs.run("rank", timeout=60).values() == [0, 1]
            except Exception as exc:  # counted: the test's point is that there are none
                failures += 1
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
            calls += 1
        stats = json.loads(flood.stdout.read().strip().splitlines()[-1])
        flood.wait(30)

        assert failures == 0, (failures, calls, errors[:3], stats)
        assert calls >= 3, (calls, stats)  # the mesh answered throughout, not once
        # The flood was real: far more connections than the agent has fds, and
        # the agent closed most of them before their handshake deadline.
        assert stats["opened"] >= CONNECTIONS, stats
        assert stats["dropped"] >= CONNECTIONS // 2, stats
        assert agent.poll() is None, "the agent died during the flood"
        assert set(procs.pids) == workers  # the same ranks: none was restarted
        assert procs.run("rank + 1", timeout=60).values() == [1, 2]
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        if flood is not None:
            flood.communicate(timeout=30)
        if procs is not None:
            procs.stop()
        if hosts is not None:
            hosts.shutdown()
        agent.terminate()
        agent.wait(30)
    log = log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "Too many open files" not in log or "keeps serving" in log, log[-3000:]
    # The guard said what it did, once.
    assert log.count("have not finished their handshake") == 1, log[-3000:]
    assert not wait_for_exit({agent.pid, *workers}, 30)


# A controller of a two-host mesh (agents that dial its CURVE endpoint, as
# ssh_hosts starts them; here "ssh" runs the command locally) held to
# ulimit -n 1024: it prints its endpoint, calls the ranks until stdin closes,
# then prints how many calls it made and how many failed.
_CONTROLLER = textwrap.dedent(
    """
    import json, logging, os, resource, sys, threading
    n = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    from monarch_nb import ssh_hosts
    ssh = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")
    hosts = ssh_hosts(["host0", "host1"], ssh=ssh, bind="127.0.0.1")
    procs = hosts.spawn_procs({"procs": 1})
    assert procs.run("rank").values() == [0, 1]
    print(hosts._agents.endpoint, *procs.pids, flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    calls = failures = 0
    errors = []
    while not stop.is_set():
        try:
            assert procs.run("rank", timeout=60).values() == [0, 1]
        except Exception as exc:
            failures += 1
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        calls += 1
    guard = hosts._agents.controller._hosts_guard.statistics()
    print(json.dumps(dict(calls=calls, failures=failures, errors=errors[:3],
                          refused=guard.refused, accepted=guard.accepted)), flush=True)
    procs.stop()
    hosts.shutdown()
    """
)


def test_a_keyless_flood_on_the_controllers_endpoint_leaves_a_multi_host_mesh_answering():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < CONNECTIONS + 200:
        pytest.skip(f"the flood needs {CONNECTIONS + 200} fds of its own")
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER, str(FD_LIMIT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    flood = None
    workers: set[int] = set()
    try:
        assert controller.stdin is not None
        assert controller.stdout is not None
        endpoint, *pids = controller.stdout.readline().split()
        workers = {int(p) for p in pids}
        assert len(workers) == 2, (endpoint, controller.poll())
        port = endpoint.rpartition(":")[2]
        flood = subprocess.Popen(
            [sys.executable, "-c", _FLOOD, port, str(CONNECTIONS), str(FLOOD_S), str(MAX_OPENS)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "flooding"
        stats = json.loads(flood.stdout.read().strip().splitlines()[-1])
        flood.wait(30)
        controller.stdin.close()  # the controller stops calling, reports, shuts down
        report = json.loads(controller.stdout.readline())
        assert controller.stderr is not None
        err = controller.stderr.read()  # to its end: the controller has exited
        controller.wait(120)
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        if flood is not None:
            flood.communicate(timeout=30)
        if controller.poll() is None:
            controller.kill()
            controller.wait(30)
        for pipe in (controller.stdout, controller.stderr):
            if pipe is not None:
                pipe.close()
    assert report["failures"] == 0, (report, stats)
    assert report["calls"] >= 3, (report, stats)  # it answered throughout, not once
    # The flood was real: more connections than the controller has fds, most of
    # them closed before their handshake deadline.
    assert stats["opened"] >= CONNECTIONS, stats
    assert stats["dropped"] >= CONNECTIONS // 2, stats
    assert report["refused"] > 0, report
    assert controller.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.count("have not finished their handshake") == 1, err[-3000:]
    assert not wait_for_exit(workers, 30)
