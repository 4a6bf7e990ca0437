"""Casts down a tree of host agents (``host_tree_fanout``), with real local agents.

Every "host" is this machine and "ssh" runs the agent locally, as in
test_multihost.py; the tree links between agents are real CURVE sockets.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import zmq
from local_hosts import tree_hosts, tree_procs
from zmq.utils.monitor import recv_monitor_message

from monarch_nb import MeshFailure, MeshUsageError
from monarch_nb._controller._agent_tree import build, parse_fanout


@pytest.fixture(scope="module")
def hosts5():
    # fan-out 2 over 5 hosts: the controller sends to h0 (relaying to h1) and
    # h2 (relaying to h3 and h4): two levels.
    hosts = tree_hosts(5, "2")
    yield hosts
    hosts.shutdown()


def test_a_cast_goes_down_a_two_level_tree_and_reaches_every_rank_once(hosts5) -> None:
    tree = hosts5._agents.tree
    assert tree.active
    assert tree.depth() == 2
    with hosts5.spawn_procs({"procs": 2}) as procs:
        routes = procs._group.routes(procs.shape.ranks)
        assert len(routes) == 2  # five hosts, two sends from the controller
        procs.exec("hits = globals().get('hits', 0) + 1").get(timeout=60)
        assert list(procs.run("(rank, hits)").values()) == [(r, 1) for r in range(10)]
        # A cast to the deepest hosts only goes down their branch.
        deep = procs.slice(hosts=slice(3, 5))
        ((via, envelope),) = procs._group.routes((6, 7, 8, 9))  # one send, to h2
        assert via == hosts5._agents.agents[2].identity
        assert envelope.startswith(b"T")
        assert list(deep.run("rank").values()) == [6, 7, 8, 9]
        assert list(procs.run("hits").values()) == [1] * 10


def test_the_tree_link_admits_only_the_host_meshs_agents(hosts5) -> None:
    agents = hosts5._agents
    endpoint = agents.tree.endpoints[3].decode()  # a child's link
    curve = agents.keys["curve"]

    def handshake(public: bytes, secret: bytes) -> int:
        context = zmq.Context()
        try:
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            monitor = sock.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_SUCCEEDED
                | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            )
            sock.curve_serverkey = curve["client_public"].encode()
            sock.curve_publickey, sock.curve_secretkey = public, secret
            sock.connect(endpoint)
            assert monitor.poll(30_000), "no handshake outcome within 30 s"
            event = recv_monitor_message(monitor)["event"]
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
            return int(event)
        finally:
            context.destroy(0)

    stranger = handshake(*zmq.curve_keypair())
    assert stranger != zmq.EVENT_HANDSHAKE_SUCCEEDED
    ours = handshake(curve["client_public"].encode(), curve["client_secret"].encode())
    assert ours == zmq.EVENT_HANDSHAKE_SUCCEEDED


def test_an_intermediate_agent_killed_mid_cast_fails_the_cast_naming_it() -> None:
    # fan-out 2 over 4 hosts: h2 relays casts to h3.
    with tree_procs(4) as (hosts, procs):
        relay = hosts._agents.agents[2].pid
        os.kill(relay, signal.SIGSTOP)  # it holds the cast for h3 ...
        call = procs.slice(hosts=3).exec("'reached'")
        os.kill(relay, signal.SIGKILL)  # ... and dies with it
        started = time.monotonic()
        with pytest.raises(MeshFailure, match=r"host h2 .*relayed casts to hosts h3") as info:
            call.get(timeout=30)
        # The launcher's exit, at once; nowhere near the 5 s heartbeat timeout.
        assert time.monotonic() - started < 4.0
        assert info.value.ranks == (3,)
        # The tree is rebuilt around h2: h3 is reached again, and so is the rest.
        assert list(procs.slice(hosts=3).run("rank").values()) == [3]
        assert list(procs.slice(hosts=slice(0, 2)).run("rank").values()) == [0, 1]


def test_fanouts_are_read_per_level_and_bad_ones_are_refused() -> None:
    assert parse_fanout("32") == (32,)
    assert parse_fanout("8, 16") == (8, 16)
    assert parse_fanout("0") == ()
    for bad in ("1", "x", "8,1", ""):
        with pytest.raises(MeshUsageError, match="host_tree_fanout"):
            parse_fanout(bad)
    # 64 hosts by 8: eight subtrees of eight hosts, two levels.
    roots = build(list(range(64)), (8,))
    assert [r.agent for r in roots] == list(range(0, 64, 8))
    assert all(len(r.children) == 7 and not r.children[0].children for r in roots)
    # 100,000 hosts by 32: every host once, four levels.
    roots = build(list(range(100_000)), (32,))
    seen = [n.agent for r in roots for n in r.walk()]
    assert sorted(seen) == list(range(100_000))

    def depth(nodes) -> int:
        return 1 + max((depth(n.children) for n in nodes if n.children), default=0)

    assert len(roots) == 32
    assert depth(roots) == 4
