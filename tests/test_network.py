"""Ports chosen for a listener that binds later (MASTER_PORT, an agent's address)."""

from __future__ import annotations

import random
import socket

from monarch_nb._common import _network


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
