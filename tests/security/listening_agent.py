"""An agent started as ``monarch-nb agent --listen`` on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def start_listening_agent(
    key_file: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """The agent process and its ``tcp://`` address, once it accepts connections.
    The caller terminates it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monarch_nb.agent",
            "--listen",
            address,
            "--key-file",
            str(key_file),
        ],
        env=dict(os.environ, **(env or {})),
    )
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return agent, address
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            raise AssertionError(f"the agent never listened (exit code {agent.poll()})")
        time.sleep(0.1)
