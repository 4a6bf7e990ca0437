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
import threading
import time

import pytest
import zmq
from polling import wait_until

from monarch_nb._wire import _fd_limits, _network
from monarch_nb._wire._handshake_guard import HandshakeGuard


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
        from monarch_nb._wire import _network, _fd_limits
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
        "import resource; from monarch_nb._wire._fd_limits import raise_fd_limit; "
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
    """A CURVE server DEALER on loopback under a guard of 4 pending handshakes, a
    client with the key already through its handshake, and the server's public key."""
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
    yield guard, server, client, port, server_public
    guard.close()
    for sock in (server, client):
        sock.close(0)
    ctx.term()


def _events_handled(guard: HandshakeGuard) -> HandshakeGuard:
    guard.readable()  # as its owner's loop does when the monitor is readable
    return guard


def test_connections_past_the_cap_of_pending_handshakes_are_closed(guarded_server, caplog):
    guard, server, client, port, _ = guarded_server
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


def _declare_huge_frame(port: int, mechanism: bytes, send: int) -> socket.socket:
    """A stranger's connection: a ZMTP greeting, then a frame header that declares
    1 GiB, then ``send`` bytes of it (what libzmq would buffer until it is whole)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + mechanism.ljust(20, b"\0")
    s.sendall(greeting + bytes(32) + b"\x06" + (1 << 30).to_bytes(8, "big"))
    try:
        s.sendall(bytes(send))
    except OSError:
        pass  # shut down meanwhile: what the tests want
    return s


def _ended(s: socket.socket) -> bool:
    """Whether the server closed (or reset) this connection."""
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_stranger_past_the_pre_auth_budget_is_shut_down_and_a_keyed_client_is_not(
    guarded_server, caplog
):
    guard, server, _, port, server_public = guarded_server
    assert guard.pre_auth_bytes == 64 << 10
    with caplog.at_level(logging.WARNING, logger="monarch_nb.test"):
        stranger = _declare_huge_frame(port, b"CURVE", 256 << 10)
        try:
            wait_until(lambda: _events_handled(guard).over_budget == 1, 30, "the stranger cut")
            assert _ended(stranger)
        finally:
            stranger.close()
    assert sum("before authenticating" in r.getMessage() for r in caplog.records) == 1
    # A client with the key that sends megabytes as soon as it is through (within
    # the handshake window, while the guard still watches its connection) keeps
    # its connection: the server's READY went out before any of its bytes.
    ctx = zmq.Context.instance()
    keyed = ctx.socket(zmq.DEALER)
    try:
        keyed.curve_serverkey = server_public
        keyed.curve_publickey, keyed.curve_secretkey = zmq.curve_keypair()
        keyed.connect(f"tcp://127.0.0.1:{port}")
        big = bytes(8 << 20)
        keyed.send(big)
        deadline = time.monotonic() + 30
        while not server.poll(100):
            _events_handled(guard)
            assert time.monotonic() < deadline, "the keyed client's message never came"
        assert server.recv() == big
        _events_handled(guard)
    finally:
        keyed.close(0)
    assert guard.over_budget == 1
    assert guard.refused == 0


def test_on_a_plain_port_a_connection_is_proven_by_our_answer(caplog):
    # MONARCH_NB_BIND: no CURVE, anyone completes the handshake; our HMAC check
    # is the authentication. Until we have sent a peer something of ours (only
    # to a routing id we handed out), it may bring 64 KiB.
    ctx = zmq.Context.instance()
    router, worker = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    guard = HandshakeGuard(router, logger=logging.getLogger("monarch_nb.test"), who="test",
                           mechanism="null")  # fmt: skip
    strangers: list[socket.socket] = []
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        worker.setsockopt(zmq.IDENTITY, b"w" * 16)
        worker.connect(f"tcp://127.0.0.1:{port}")
        worker.send(b"hello")
        assert router.poll(30_000)
        assert router.recv_multipart() == [b"w" * 16, b"hello"]
        router.send_multipart([b"w" * 16, b"a call of ours" * 10])
        assert worker.poll(30_000)
        worker.recv()
        big = bytes(8 << 20)
        worker.send(big)
        deadline = time.monotonic() + 30
        while not router.poll(100):
            _events_handled(guard)
            assert time.monotonic() < deadline, "the worker's reply never came"
        assert router.recv_multipart()[1] == big
        # Strangers: one declares a huge frame; one, a zmq client, sends
        # well-formed messages (dropped unread as unsigned, but they count).
        strangers.append(_declare_huge_frame(port, b"NULL", 256 << 10))
        junk = ctx.socket(zmq.DEALER)
        junk.setsockopt(zmq.LINGER, 0)
        junk.connect(f"tcp://127.0.0.1:{port}")
        for _ in range(256):
            junk.send(bytes(1024))
        deadline = time.monotonic() + 30
        while _events_handled(guard).over_budget < 2:
            while router.poll(0):
                router.recv_multipart()  # the stranger's, until it is cut
            assert time.monotonic() < deadline, guard.statistics()
            time.sleep(0.01)
        junk.close(0)
        assert _ended(strangers[0])
        worker.send(b"still here")
        while True:
            assert router.poll(30_000)
            message = router.recv_multipart()
            if message[0] == b"w" * 16:
                break
        assert message == [b"w" * 16, b"still here"]
    finally:
        for s in strangers:
            s.close()
        guard.close()
        router.close(0)
        worker.close(0)


def test_a_new_connection_under_a_reused_fd_number_is_still_watched():
    # Strangers one after another on six threads: the guard cuts one, libzmq
    # closes its fd, and the next stranger's connection gets that fd number
    # while the guard's thread still holds the old one as checked. It used to
    # forget the new connection with the old, which then streamed without a
    # limit (a whole 128 MiB in CI).
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    guard = HandshakeGuard(router, logger=logging.getLogger("monarch_nb.test"), who="test",
                           mechanism="null")  # fmt: skip
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def owner_loop() -> None:  # the guard's owner: handles the monitor's events
        while not stop.is_set():
            if guard.monitor.poll(20):
                while guard.readable():
                    pass

    owner = threading.Thread(target=owner_loop)
    owner.start()
    most_sent: list[int] = []

    def strangers_one_after_another() -> None:
        for _ in range(40):
            stranger = _declare_huge_frame(port, b"NULL", 0)
            sent, chunk = 0, bytes(1 << 20)
            try:
                while sent < 64 << 20:
                    stranger.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # cut: what we want
            finally:
                stranger.close()
            most_sent.append(sent)

    threads = [threading.Thread(target=strangers_one_after_another) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        stop.set()
        owner.join(30)
        guard.close()
        router.close(0)
        ctx.term()
    assert len(most_sent) == 240
    # Each is cut within a check or so of passing 64 KiB; none runs to the end.
    assert max(most_sent) < 64 << 20, f"{most_sent.count(64 << 20)} strangers never cut"


def test_failed_handshakes_reach_the_guards_listeners(guarded_server):
    guard, _, _, port, _ = guarded_server
    failed: list[str] = []
    remove = guard.on_handshake_failed(failed.append)
    ctx = zmq.Context.instance()
    wrong = ctx.socket(zmq.DEALER)
    try:
        wrong.curve_serverkey = zmq.curve_keypair()[0]  # not the server's
        wrong.curve_publickey, wrong.curve_secretkey = zmq.curve_keypair()
        wrong.connect(f"tcp://127.0.0.1:{port}")
        wait_until(lambda: _events_handled(guard) and failed, 30, "a failed handshake")
        assert failed[0] == f"tcp://127.0.0.1:{port}"
        remove()
        seen = len(failed)
        wait_until(lambda: _events_handled(guard).statistics().accepted >= 3, 30, "a retry")
        assert len(failed) == seen
    finally:
        wrong.close(0)


def test_a_ranks_inbox_between_hosts_is_guarded():
    from monarch_nb._runtime._peer import PeerNode
    from monarch_nb._wire._signed import new_key

    node = PeerNode(None, new_key(), tcp_host="127.0.0.1")
    stranger = None
    try:
        assert node.tcp_inbox is not None
        assert node._guard is not None
        assert node.tcp_inbox.getsockopt(zmq.HANDSHAKE_IVL) == 5_000
        port = int(node.tcp_address.rpartition(":")[2])
        stranger = _declare_huge_frame(port, b"CURVE", 256 << 10)
        guard = node._guard
        wait_until(lambda: guard.over_budget == 1, 30, "the node's thread to cut the stranger")
        assert _ended(stranger)
    finally:
        if stranger is not None:
            stranger.close()
        node.close()
