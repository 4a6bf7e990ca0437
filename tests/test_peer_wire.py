"""The peer layer's wire: only signed frames of our tree are read, from our uid only."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import zmq

from monarch_nb import Actor, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x


class _Boom:
    """Unpickling this would create a file: the proof that a frame was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_unsigned_and_forged_frames_to_an_inbox_are_never_unpickled(procs2, tmp_path):
    echo = procs2.spawn("echo", Echo)
    ref = echo.__reduce__()[1][0]
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Boom(str(marker)))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ref.procs.address(0))
    try:
        for frames in (
            [payload],
            [b"\0" * 57 + payload],  # a header of the right size, a wrong signature
            [b"\0" * 57, payload, payload],
            [b""],
            [os.urandom(64) for _ in range(5)],
        ):
            sock.send_multipart(frames)
        # The rank still answers its real callers, and nothing was unpickled.
        assert echo.echo.call(1).get(timeout=60).values() == [1, 1]
    finally:
        sock.close(0)
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attack as another user")
def test_another_user_cannot_connect_to_an_inbox(procs2):
    echo = procs2.spawn("echo2", Echo)
    path = echo.__reduce__()[1][0].procs.address(0).removeprefix("ipc://")
    attack = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1]); print('connected')\n"
        "except OSError as e: print(type(e).__name__)\n"
    )
    result = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            attack,
            path,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "PermissionError", result
    assert echo.echo.call(2).get(timeout=60).values() == [2, 2]
