"""A listening agent nobody attaches to ends by itself (``agent_idle_timeout``).

A ``ProcessJob``'s agents (or any ``monarch-nb agent --listen``) used to wait
for a controller forever, holding a port and a key. Now, after the setting's
seconds with no controller attached, the agent exits and removes a key file
its job made; an attached agent never does, and its idle time starts again
when its controller leaves. Real agent processes, a real controller.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import pytest
from listening_agent import start_listening_agent
from process_checks import wait_for_exit

from monarch_nb import attach
from monarch_nb._controller._client import Controller

pytestmark = pytest.mark.timeout(120)

EXIT_DEADLINE_S = 30.0  # the limit plus a heartbeat, with room for a loaded machine


def _key_file(directory, name: str) -> str:
    path = str(directory / name)
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", path], check=True)
    return path


def _exits_by_itself(agent: subprocess.Popen) -> int | None:
    try:
        return agent.wait(EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired:
        return None


def test_an_agent_nobody_attaches_exits_and_removes_its_jobs_key_file(tmp_path):
    job_key = _key_file(tmp_path, f"job-{secrets.token_hex(6)}.key")  # as a job names it
    own_key = _key_file(tmp_path, "mine.key")  # made with monarch-nb keygen: the user's
    limit = {"MONARCH_NB_AGENT_IDLE_TIMEOUT": "0.5"}
    agents = [start_listening_agent(key, env=limit)[0] for key in (job_key, own_key)]
    try:
        assert [_exits_by_itself(agent) for agent in agents] == [0, 0]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(10)
    assert not os.path.exists(job_key)
    assert os.path.exists(own_key)


def test_an_attached_agent_stays_and_its_idle_time_starts_when_the_controller_leaves(tmp_path):
    Controller.get()  # started before the agent: attach() is not raced by its start
    key = _key_file(tmp_path, f"job-{secrets.token_hex(6)}.key")
    limit_s = 3.0
    agent, address = start_listening_agent(key, env={"MONARCH_NB_AGENT_IDLE_TIMEOUT": str(limit_s)})
    hosts = procs = None
    try:
        hosts = attach([address], key_file=key)
        procs = hosts.spawn_procs({"procs": 1})
        workers = set(procs.pids)
        # Attached for several limits, calls answered throughout: the agent stays.
        attached_until = time.monotonic() + 3 * limit_s
        calls = 0
        while time.monotonic() < attached_until:
            assert procs.run("rank + 1", timeout=30).values() == [1]
            calls += 1
            time.sleep(0.2)  # a span of attached time to cover, not an event to wait for
        assert agent.poll() is None, "the agent exited with a controller attached"
        assert calls >= 5
        procs.stop()
        procs = None
        hosts.shutdown()  # the controller leaves: from now on the agent is idle
        hosts = None
        left = time.monotonic()
        assert _exits_by_itself(agent) == 0
        assert time.monotonic() - left >= limit_s - 0.5  # idle counted from the leaving
    finally:
        if procs is not None:
            procs.stop()
        if hosts is not None:
            hosts.shutdown()
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)
    assert not os.path.exists(key)
    assert not wait_for_exit(workers, 10)


def test_a_bad_idle_timeout_is_named_at_start(tmp_path):
    key = _key_file(tmp_path, "agent.key")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "monarch_nb.agent",
            "--listen",
            "tcp://127.0.0.1:0",
            *("--key-file", key),
        ],
        env=dict(os.environ, MONARCH_NB_AGENT_IDLE_TIMEOUT="an hour"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "MONARCH_NB_AGENT_IDLE_TIMEOUT='an hour' is not a valid float" in done.stderr
