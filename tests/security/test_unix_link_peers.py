"""The Unix link (the controller's default link to local workers) admits only our
uid, twice over.

Its socket lives in the tree's 0700 run directory, so another user cannot
even connect; and if the directory ever let them (a run directory made
elsewhere, a mode changed by hand), the listener still checks the peer's uid
(``SO_PEERCRED``) and hangs up on anyone else, before reading a byte.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
import time

from monarch_nb._wire import _sockets
from monarch_nb._wire._rundir import run_dir
from monarch_nb._wire._signed import Receiver, WireStats
from monarch_nb._wire._unix_link import LinkDealer, LinkRouter

_GREET_AS_OTHER_USER = textwrap.dedent(
    """
    import socket, struct, sys
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError as e:
        print(type(e).__name__)
        raise SystemExit
    try:
        s.sendall(struct.pack("<IQ", 1, 5) + b"rogue" + struct.pack("<IQ", 1, 2) + b"hi")
        s.settimeout(60)
        print("closed" if s.recv(1) == b"" else "answered")
    except (BrokenPipeError, ConnectionResetError):
        print("closed")
    """
)


def _take_for(router: LinkRouter, seconds: float) -> list[list]:
    got: list[list] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got.extend(Receiver(router, WireStats()).take()[0])
        time.sleep(0.05)
    return got


def test_another_user_cannot_connect_in_the_run_directory(attacker):
    router = LinkRouter(os.path.join(run_dir(), "link-security-test"))
    try:
        out = attacker.run(_GREET_AS_OTHER_USER, router.path)
        assert out.stdout.strip() == "PermissionError", out
    finally:
        router.close()


def test_the_listener_hangs_up_on_another_uid_even_where_it_could_connect(attacker):
    open_dir = tempfile.mkdtemp(prefix="monarch_nb-open-", dir="/tmp")
    os.chmod(open_dir, 0o777)  # a directory that would let anyone in
    router = LinkRouter(os.path.join(open_dir, "link"))
    os.chmod(router.path, 0o777)
    ours = LinkDealer(router.address, b"ours")
    try:
        rogue = attacker.popen(_GREET_AS_OTHER_USER, router.path)
        # The router accepts (and checks) only while someone takes from it.
        deadline = time.monotonic() + 60
        while rogue.poll() is None:
            assert time.monotonic() < deadline, "the rogue's connection was never closed"
            assert _take_for(router, 0.2) == []
        out, err = rogue.communicate(timeout=30)
        assert out.strip() == "closed", err
        _sockets.send_copied(ours, [b"still here"])
        deadline = time.monotonic() + 30
        got: list[list] = []
        while not got:
            assert time.monotonic() < deadline
            got = _take_for(router, 0.1)
        assert got == [[b"ours", b"still here"]]
    finally:
        ours.close()
        router.close()
        shutil.rmtree(open_dir, ignore_errors=True)
