"""Ports chosen for a listener that binds later (MASTER_PORT, an agent's address);
file descriptors raised and running out; the cap on connections still in their
handshake on a listening endpoint."""

from __future__ import annotations

import logging
import random
import socket
import subprocess
import sys
import textwrap

import pytest
import zmq
from polling import wait_until

from monarch_nb._common import _fd_limits, _network
from monarch_nb._common._handshake_guard import HandshakeGuard


def test_a_free_port_lies_outside_the_range_outgoing_connections_draw_from() -> None:
    # The port of an outgoing connection comes from the ephemeral range; a
    # MASTER_PORT from there could be taken before torch's store binds it.
    low, high = _network._ephemeral_ports()
    ports = {_network.free_port("127.0.0.1") for _ in range(50)}
    assert all(not low <= port <= high for port in ports), (ports, low, high)
    assert all(port < 30_000 for port in ports)  # below Kubernetes' NodePorts
    assert len(ports) > 1  # chosen at random, so two callers rarely meet
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", _network.free_port("127.0.0.1")))
        listener.listen()
        taken = listener.getsockname()[1]
        other = _network.free_port("127.0.0.1")
        draws = iter([taken, taken, other])
        monkeypatch.setattr(_network._random, "choice", lambda choices: next(draws))
        assert _network.free_port("127.0.0.1") == other


def test_a_seeded_random_module_is_left_alone() -> None:
    # User code on a rank may seed `random` alike everywhere; rank 0 choosing
    # MASTER_PORT must not take a draw from it.
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    _network.free_port("127.0.0.1")
    assert [random.random() for _ in range(3)] == expected


def test_free_port_says_when_no_fd_is_left() -> None:
    # Out of fds is not "every port is taken": it raises, and the caller fails
    # that one request (the agent reports its last port found instead).
    code = textwrap.dedent(
        """
        import resource, socket
        from monarch_nb._common import _network, _fd_limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        held = []
        try:
            while True:
                held.append(socket.socket())
        except OSError:
            pass
        try:
            _network.free_port()
        except OSError as exc:
            print("exhausted" if _fd_limits.exhausted(exc) else exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "exhausted", out


def test_the_soft_fd_limit_is_raised_to_the_hard_one() -> None:
    code = (
        "import resource; from monarch_nb._common._fd_limits import raise_fd_limit; "
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); "
        "print(raise_fd_limit() == hard == resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out


def test_running_out_of_fds_is_said_once(caplog) -> None:
    warning = _fd_limits.ExhaustionWarning(logging.getLogger("monarch_nb.test"), "agent 3")
    exc = OSError(24, "Too many open files")
    with caplog.at_level(logging.WARNING, logger="monarch_nb.test"):
        for _ in range(100):
            warning.failed("looking for a free port (MASTER_PORT)", exc)
    assert warning.failures == 100
    (record,) = caplog.records
    assert "agent 3 is out of file descriptors" in record.getMessage()
    assert "looking for a free port" in record.getMessage()
    assert _fd_limits.exhausted(exc)
    assert not _fd_limits.exhausted(OSError(98, "in use"))


_GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"CURVE".ljust(20, b"\0") + bytes(32)


@pytest.fixture
def guarded_server():
    """A CURVE server DEALER on loopback under a guard of 4 pending handshakes, and
    a client with the key already through its handshake."""
    ctx = zmq.Context()
    server, client = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    guard = HandshakeGuard(server, logger=logging.getLogger("monarch_nb.test"), who="test",
                           max_pending=4)  # fmt: skip
    server.curve_server = True
    server.curve_publickey, server.curve_secretkey = server_public, server_secret
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client.curve_serverkey = server_public
    client.curve_publickey, client.curve_secretkey = client_public, client_secret
    client.connect(f"tcp://127.0.0.1:{port}")
    client.send(b"hello")
    assert server.poll(30_000)
    assert server.recv() == b"hello"
    yield guard, server, client, port
    guard.close()
    for sock in (server, client):
        sock.close(0)
    ctx.term()


def _events_handled(guard: HandshakeGuard) -> HandshakeGuard:
    guard.readable()  # as its owner's loop does when the monitor is readable
    return guard


def test_connections_past_the_cap_of_pending_handshakes_are_closed(guarded_server, caplog):
    guard, server, client, port = guarded_server
    assert server.getsockopt(zmq.HANDSHAKE_IVL) == 5_000
    strangers: list[socket.socket] = []
    try:
        with caplog.at_level(logging.WARNING, logger="monarch_nb.test"):
            for _ in range(12):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                strangers.append(s)
                s.sendall(_GREETING)
            wait_until(lambda: _events_handled(guard).refused >= 8, 30, "the excess closed")
        assert guard.accepted == 13  # the client with the key, and the 12 strangers
        assert guard.refused == 8
        assert guard.statistics().pending == {port: 4}
        ended = 0
        for s in strangers:
            try:
                s.recv(64)  # the server's greeting, then the end (or a reset)
                ended += s.recv(64) == b""
            except ConnectionResetError:
                ended += 1
            except TimeoutError:
                pass
        # Well within the 5 s handshake deadline, which only the 4 others wait for.
        assert ended >= 8
    finally:
        for s in strangers:
            s.close()
    # The client with the key was through already: untouched.
    client.send(b"still here")
    assert server.poll(30_000)
    assert server.recv() == b"still here"
    assert sum("have not finished their handshake" in r.getMessage() for r in caplog.records) == 1
