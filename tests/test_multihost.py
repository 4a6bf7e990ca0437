"""Multi-host meshes on this machine: real agents, real CURVE links, real faults.

Here every "host" is this machine and "ssh" runs the agent's command locally
(``LOCAL_SSH``), so these tests need no root; tests/multihost/ runs the same
code through real sshd servers in network namespaces.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import zmq
from process_checks import wait_for_exit
from rogues import Rogue

from monarch_nb import (
    MeshFailure,
    MeshUsageError,
    ProfilerUnavailable,
    RankState,
    RemoteError,
    attach,
    ssh_hosts,
)
from monarch_nb._wire._network import free_port
from monarch_nb._wire._signed import OWN, Signer, WireStats

# "ssh HOST COMMAND" without ssh: run COMMAND here, with a shell, as sshd would.
LOCAL_SSH = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def local_hosts(n: int = 2, **kwargs):
    return ssh_hosts([f"host{i}" for i in range(n)], ssh=LOCAL_SSH, bind="127.0.0.1", **kwargs)


@pytest.fixture(scope="module")
def hosts2():
    hosts = local_hosts(2)
    yield hosts
    hosts.shutdown()


def test_ranks_span_hosts_with_torchrun_environment(hosts2) -> None:
    with hosts2.spawn_procs({"procs": 2}) as procs:
        assert procs.shape.labels == ("hosts", "procs")
        assert procs.shape.sizes == (2, 2)
        env = procs.run(
            "import os\n"
            "tuple(os.environ[k] for k in "
            "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK'))"
        )
        assert list(env.values()) == [
            ("0", "0", "4", "2", "0"),
            ("1", "1", "4", "2", "0"),
            ("2", "0", "4", "2", "1"),
            ("3", "1", "4", "2", "1"),
        ]
        master = procs.run("import os; (os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])")
        assert len(set(master.values())) == 1  # every rank agrees on rank 0's address
        status = procs.status()
        assert [r.host for r in status.ranks] == ["host0", "host0", "host1", "host1"]
        assert all(r.pid > 0 and r.state is RankState.IDLE for r in status.ranks)
        assert hosts2.hosts == ["host0", "host1"]


def test_a_cast_is_one_message_per_host(hosts2) -> None:
    with hosts2.spawn_procs({"procs": 3}) as procs:
        group = procs._group
        routes = group.routes(procs.shape.ranks)
        assert len(routes) == 2  # two hosts: two sends, each naming its three ranks
        assert sorted(len(identities) for _, identities in routes) == [3, 3]
        assert list(procs.run("rank * 2").values()) == [0, 2, 4, 6, 8, 10]


def test_output_and_errors_come_back_by_rank(hosts2, capfd) -> None:
    with hosts2.spawn_procs({"procs": 1}) as procs:
        procs.run("print(f'line from rank {rank}')")
        tails = {r: [o.line for o in procs.output_tail(r)] for r in range(2)}
        assert tails == {0: ["line from rank 0"], 1: ["line from rank 1"]}
        with pytest.raises(Exception, match="ZeroDivisionError") as info:
            procs.run("1 / (rank - 1)")
        assert "rank 1" in str(info.value)
        assert list(procs.run("'still here'").values()) == ["still here"] * 2


def test_gloo_all_reduce_across_hosts(hosts2) -> None:
    pytest.importorskip("torch")
    with hosts2.spawn_procs({"procs": 2}) as procs:
        result = procs.run(
            textwrap.dedent(
                """
                import torch, torch.distributed as dist
                dist.init_process_group("gloo")
                t = torch.full((2,), float(rank))
                dist.all_reduce(t)
                dist.destroy_process_group()
                t.tolist()
                """
            ),
            # If one rank fails (say, rank 0 cannot listen on MASTER_PORT) the
            # others would wait in the rendezvous: fail at once with its error; and
            # on a stall, interrupt the ranks so their tracebacks say where each
            # waited, before pytest's timeout kills the test blind.
            fail_fast=True,
            timeout=90,
        )
        assert list(result.values()) == [[6.0, 6.0]] * 4


def test_a_later_mesh_gets_a_port_its_host_found_free_not_the_next_one(hosts2) -> None:
    """Each mesh's MASTER_PORT is one the first host's agent found free at its
    last heartbeat. Later meshes used to take the first one's + 1, + 2, ...
    unchecked: one taken meanwhile on that host failed the rendezvous."""
    pytest.importorskip("torch")
    read_port = "import os; int(os.environ['MASTER_PORT'])"
    with hosts2.spawn_procs({"procs": 1}) as procs:
        (first,) = set(procs.run(read_port).values())
    blocker = socket.socket()
    try:
        try:
            blocker.bind(("", first + 1))  # what the old rule gives the next mesh
            blocker.listen()
        except OSError:
            pass  # taken already: all the same for this test
        agents = hosts2._agents
        deadline = time.monotonic() + 60
        while agents.agents[0].free_port in agents._ports_given:  # a heartbeat's report
            assert time.monotonic() < deadline, "the agent reported no new free port"
            time.sleep(0.05)
        with hosts2.spawn_procs({"procs": 1}) as procs:
            (second,) = set(procs.run(read_port).values())
            assert second != first + 1
            result = procs.run(
                "import torch, torch.distributed as dist\n"
                "dist.init_process_group('gloo')\n"
                "t = torch.ones(1)\n"
                "dist.all_reduce(t)\n"
                "dist.destroy_process_group()\n"
                "t.item()",
                fail_fast=True,
                timeout=90,
            )
            assert list(result.values()) == [2.0, 2.0]
            # Started at once, before the agent's next report: still a port of its own.
            with hosts2.spawn_procs({"procs": 1}) as third:
                (port,) = set(third.run(read_port).values())
                assert port not in (first + 1, second)
    finally:
        blocker.close()


def test_native_stacks_and_profiles_of_remote_ranks_are_run_by_their_agent(hosts2) -> None:
    from monarch_nb._services import _py_spy

    if _py_spy.find() is None:
        pytest.skip("py-spy is not installed here")
    with hosts2.spawn_procs({"procs": 1}, echo_output=False) as procs:
        procs.exec("import time\ndef nap():\n    time.sleep(600)\nnap()")
        deadline = time.monotonic() + 60
        while True:
            try:
                stacks = procs.stacks(native=True)
            except ProfilerUnavailable as exc:  # the agents' host refuses ptrace
                pytest.skip(str(exc))
            if all("nap (<mesh-cell-" in s for s in stacks.values()):
                break
            assert time.monotonic() < deadline, f"the ranks never reached nap():\n{stacks}"
        assert all(w.route is not None for w in procs._group.workers)  # via the agents
        assert [ranks for ranks, _ in stacks.groups()] == [(0, 1)]
        assert 'Thread "MainThread"' in stacks[1]
        profile = procs.profile(1, format="speedscope")
        assert sorted(profile.files) + sorted(profile.notes) == [0, 1]
        procs.interrupt()


def test_gpus_are_the_hosts_own_and_counted_there(monkeypatch) -> None:
    # Each agent hands out the GPUs its host lets it see; too many is refused
    # before anything starts, naming the host.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # what the "hosts" see
    with local_hosts(2) as hosts:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # the controller has none
        with hosts.spawn_procs({"gpus": 2}) as procs:
            seen = procs.run("import os; os.environ['CUDA_VISIBLE_DEVICES']")
            assert list(seen.values()) == ["3", "5", "3", "5"]
        with pytest.raises(MeshUsageError, match="needs 3 GPUs but host host0 has 2 visible"):
            hosts.spawn_procs({"gpus": 3})


def test_gpus_on_hosts_without_any_are_cpu_ranks(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what the "hosts" see: no GPU
    with local_hosts(2) as hosts, hosts.spawn_procs({"gpus": 2}) as procs:
        assert procs.extent == {"hosts": 2, "gpus": 2}
        seen = procs.run("import os; os.environ.get('CUDA_VISIBLE_DEVICES')")
        assert list(seen.values()) == [""] * 4


def test_a_killed_remote_rank_fails_the_mesh_naming_it_and_restart_works(hosts2) -> None:
    with hosts2.spawn_procs({"procs": 2}) as procs:
        victim = procs.pids[3]
        call = procs.exec("import time; time.sleep(30)")
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(MeshFailure, match=r"rank 3 \(pid \d+\).*SIGKILL") as info:
            call.get(timeout=10)
        assert info.value.ranks == (3,)
        procs.restart()
        assert list(procs.run("rank").values()) == [0, 1, 2, 3]


def test_a_mesh_on_several_hosts_is_not_resized(hosts2) -> None:
    with hosts2.spawn_procs({"procs": 1}) as procs:
        several = "runs on several hosts, and only meshes on this host can be resized"
        with pytest.raises(MeshUsageError, match=rf"resize\(procs=1\): .* {several}"):
            procs.resize(procs=1)
        with pytest.raises(MeshUsageError, match=rf"grow\(1\): .* {several}"):
            procs.grow(1)
        assert list(procs.run("rank").values()) == [0, 1]


def test_a_silent_host_is_lost_within_the_timeout_and_only_its_ranks_fail() -> None:
    hosts = local_hosts(2, heartbeat_timeout=2.0)
    try:
        procs = hosts.spawn_procs({"procs": 2})
        frozen = hosts._agents.agents[1].pid
        worker_pids = procs.pids
        call = procs.exec("import time; time.sleep(30)")
        os.kill(frozen, signal.SIGSTOP)  # a host that stops answering, as a cut cable
        started = time.monotonic()
        with pytest.raises(MeshFailure, match=r"host host1 .* stopped answering") as info:
            call.get(timeout=15)
        assert time.monotonic() - started < 2.0 + 3.0  # the timeout, a tick, a loaded CI
        assert info.value.ranks == (2, 3)
        states = {r.rank: r.state for r in procs.status().ranks}
        assert states[2] is RankState.DEAD
        assert states[3] is RankState.DEAD
        assert states[0] is not RankState.DEAD
        os.kill(frozen, signal.SIGCONT)
        # The agent heard nothing for longer than its timeout: it kills its
        # workers and exits by itself.
        assert not wait_for_exit({frozen, worker_pids[2], worker_pids[3]}, 10)
        procs.stop()
    finally:
        hosts.shutdown()


def test_a_killed_agent_fails_its_host_at_once() -> None:
    hosts = local_hosts(2)
    try:
        procs = hosts.spawn_procs({"procs": 1})
        call = procs.exec("import time; time.sleep(30)")
        os.kill(hosts._agents.agents[0].pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(MeshFailure, match=r"host host0 .* lost its agent") as info:
            call.get(timeout=10)
        assert time.monotonic() - started < 4.0  # the launcher's exit, not the 5 s timeout
        assert info.value.ranks == (0,)
        with pytest.raises(MeshFailure, match="host host0 is lost"):
            procs.restart()
    finally:
        hosts.shutdown()


def test_workers_exit_when_their_controller_dies(tmp_path) -> None:
    script = tmp_path / "controller.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            from monarch_nb import ssh_hosts
            hosts = ssh_hosts(["a", "b"], ssh={LOCAL_SSH!r}, bind="127.0.0.1",
                              heartbeat_timeout=2.0)
            procs = hosts.spawn_procs({{"procs": 2}})
            agents = [agent.pid for agent in hosts._agents.agents]
            print(" ".join(map(str, procs.pids + agents)), flush=True)
            os._exit(0)  # no shutdown: the agents must notice on their own
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    pids = {int(p) for p in out.stdout.split()}
    assert len(pids) == 6  # 4 workers, 2 agents
    assert not wait_for_exit(pids, 10)


def test_the_host_link_is_encrypted_and_takes_only_our_agents(hosts2) -> None:
    agents = hosts2._agents
    argv = " ".join(map(str, agents.launchers[0].popen.args))
    assert "monarch_nb.agent" in argv
    assert agents.keys["key"] not in argv  # keys go on stdin, never the command line
    assert agents.keys["curve"]["client_secret"] not in argv
    address = agents.endpoint
    stats = agents.controller.stats
    curve = agents.keys["curve"]

    def drops() -> tuple[int, int, int]:
        return stats.dropped_bad_signature, stats.dropped_malformed, stats.dropped_unknown_peer

    def send_forged(sock: zmq.Socket, *, refused: bool) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        # A peer that refuses the handshake leaves no pipe for a DEALER to queue
        # on, and a send would block: a refused send is nothing delivered.
        sock.setsockopt(zmq.SNDTIMEO, 2000 if refused else 30_000)
        sock.setsockopt(zmq.ROUTING_ID, b"agent-impostor")
        sock.connect(address)
        try:
            Signer(bytes(32), WireStats(), sender=bytes(16), upstream=True).encode(
                _heartbeat()
            ).send(sock, envelope=OWN)
        except zmq.Again:
            if not refused:
                raise

    before = drops()
    context = zmq.Context()
    sockets = []
    try:
        # 1. no CURVE at all: the handshake fails, nothing is delivered
        plain = context.socket(zmq.DEALER)
        sockets.append(plain)
        send_forged(plain, refused=True)
        # 2. CURVE with the right server key but a key pair the mesh never issued (ZAP)
        stranger = context.socket(zmq.DEALER)
        sockets.append(stranger)
        stranger.curve_serverkey = curve["server_public"].encode()
        stranger.curve_publickey, stranger.curve_secretkey = zmq.curve_keypair()
        send_forged(stranger, refused=True)
        time.sleep(1.0)
        assert drops() == before
        # The control: with the mesh's own client keys the frame does get through,
        # and is dropped, counted, for its unknown identity.
        insider = context.socket(zmq.DEALER)
        sockets.append(insider)
        insider.curve_serverkey = curve["server_public"].encode()
        insider.curve_publickey = curve["client_public"].encode()
        insider.curve_secretkey = curve["client_secret"].encode()
        send_forged(insider, refused=False)
        deadline = time.monotonic() + 5
        while drops() == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drops()[2] == before[2] + 1
        # 3. a real agent's name claimed on the local workers' socket: agents have
        # a socket of their own, so on this one the name is nobody's.
        claimant = Rogue(agents.agents[0].identity, context)
        sockets.append(claimant)
        claimant.connect(agents.controller.address)
        Signer(bytes(32), WireStats(), sender=bytes(16), upstream=True).encode(_heartbeat()).send(
            claimant.socket, envelope=OWN
        )
        deadline = time.monotonic() + 30
        while drops()[2] == before[2] + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drops() == (before[0], before[1], before[2] + 2)
    finally:
        for sock in sockets:
            sock.close(0)
        context.term()
    with hosts2.spawn_procs({"procs": 1}) as procs:  # the real agents still work
        assert list(procs.run("rank").values()) == [0, 1]


def test_attach_to_agents_started_elsewhere(tmp_path) -> None:
    key_file = tmp_path / "agent.key"
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", str(key_file)], check=True)
    assert (key_file.stat().st_mode & 0o777) == 0o600
    ports = [_free_port(), _free_port()]
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "monarch_nb.agent",
                "--listen",
                f"tcp://127.0.0.1:{port}",
                "--key-file",
                str(key_file),
                "--host-index",
                str(i),
            ]
        )
        for i, port in enumerate(ports)
    ]
    try:
        addresses = [f"tcp://127.0.0.1:{p}" for p in ports]
        for _ in range(2):  # a second controller session finds the agents free again
            hosts = _attach_when_listening(addresses, str(key_file))
            with hosts.spawn_procs({"procs": 1}) as procs:
                assert list(procs.run("rank + 100").values()) == [100, 101]
            hosts.shutdown()
        assert all(agent.poll() is None for agent in agents)  # they wait for the next
    finally:
        for agent in agents:
            agent.terminate()
            agent.wait(10)


def test_attach_refuses_a_key_file_others_can_read(tmp_path) -> None:
    key_file = tmp_path / "agent.key"
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", str(key_file)], check=True)
    key_file.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        attach(["tcp://127.0.0.1:1"], key_file=str(key_file))


def test_ssh_failure_is_reported_with_what_ssh_said() -> None:
    fake = (sys.executable, "-c", "import sys; sys.exit('ssh: connect to host nowhere: refused')")
    with pytest.raises(MeshFailure, match=r"(?s)ssh to nowhere ended .*connect to host nowhere"):
        ssh_hosts(["nowhere"], ssh=fake, bind="127.0.0.1")


@pytest.mark.parametrize(
    ("hosts", "match"),
    [([], "non-empty list"), (["a", "a"], "host twice"), ([""], "non-empty")],
)
def test_bad_host_lists_are_refused(hosts, match) -> None:
    with pytest.raises(MeshUsageError, match=match):
        ssh_hosts(hosts, ssh=LOCAL_SSH)


def test_per_host_cannot_name_hosts(hosts2) -> None:
    with pytest.raises(MeshUsageError, match='cannot name a "hosts" dimension'):
        hosts2.spawn_procs({"hosts": 2})


def test_a_shut_down_host_mesh_refuses_new_meshes() -> None:
    hosts = local_hosts(1)
    hosts.shutdown()
    with pytest.raises(MeshUsageError, match="shut down"):
        hosts.spawn_procs({"procs": 1})
    assert not wait_for_exit({a.pid for a in hosts._agents.agents}, 10)


# -- helpers -------------------------------------------------------------------------


def _heartbeat():
    from monarch_nb._wire._messages import AgentHeartbeat

    return AgentHeartbeat()


def _free_port() -> int:
    return free_port("127.0.0.1")


def _attach_when_listening(addresses: list[str], key_file: str):
    for address in addresses:  # the agents bind just after they start
        port = int(address.rsplit(":", 1)[1])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
    return attach(addresses, key_file=key_file)


def test_shutting_down_the_hosts_stops_their_meshes_cleanly(caplog) -> None:
    with local_hosts(2) as hosts:
        procs = hosts.spawn_procs({"procs": 1})
        pids = procs.pids
    # The context manager's shutdown stopped the mesh first: stopped, not failed
    # (no rank reported killed), and every process is gone.
    assert procs.state == "stopped"
    assert procs.failure is None
    assert "killed" not in caplog.text
    assert not wait_for_exit(set(pids), 10)


def test_actors_on_different_hosts_call_each_other_directly(hosts2) -> None:
    from actor_hosts import Caller, Leaf  # importable by the agents' workers

    from monarch_nb import Channel

    with hosts2.spawn_procs({"procs": 1}) as procs:
        leaves = procs.spawn("leaves", Leaf)
        callers = procs.spawn("callers", Caller, leaves)
        # Each host's caller calls every leaf, its own host's and the other's, over TCP.
        got = callers.call_all.call(5).get(timeout=60)
        assert [sorted(v) for v in got.values()] == [[(0, 5), (1, 5)]] * 2
        # The references name TCP inboxes on the hosts' interface, CURVE-encrypted.
        ref = leaves.__reduce__()[1][0]
        assert ref.procs.address(1).startswith("tcp://127.0.0.1:")
        # A port on the controller, reached from the ranks.
        port, receiver = Channel.open()
        callers.send_to.call(port).get(timeout=60)
        assert sorted(receiver.recv().get(timeout=60) for _ in range(2)) == [0, 1]
        # A rank killed mid-call fails its caller on the other host.
        pending = callers.slice(hosts=0).sleep_on.call_one(1, 60.0)
        deadline = time.monotonic() + 30
        while "Leaf.sleep" not in (procs.status().ranks[1].work or ""):
            assert time.monotonic() < deadline, "the call never reached rank 1"
            time.sleep(0.05)
        os.kill(procs.pids[1], signal.SIGKILL)
        # Either the caller hears it first ("cannot be reached"), or the controller
        # fails the whole mesh first: both name rank 1, neither hangs.
        with pytest.raises((MeshFailure, RemoteError), match="rank 1"):
            pending.get(timeout=60)


def test_an_unauthenticated_client_cannot_talk_to_a_ranks_tcp_inbox(hosts2) -> None:
    from actor_hosts import Leaf

    with hosts2.spawn_procs({"procs": 1}) as procs:
        leaves = procs.spawn("leaves", Leaf)
        address = leaves.__reduce__()[1][0].procs.address(0)
        plain = zmq.Context.instance().socket(zmq.DEALER)
        curve = zmq.Context.instance().socket(zmq.DEALER)
        public, secret = zmq.curve_keypair()
        other_public, _ = zmq.curve_keypair()
        curve.curve_serverkey, curve.curve_publickey, curve.curve_secretkey = (
            other_public,
            public,
            secret,
        )
        try:
            for sock in (plain, curve):
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(address)
                sock.send_multipart([b"\0" * 57, os.urandom(1 << 16)])
            assert leaves.who.call(1).get(timeout=60).values() == [(0, 1), (1, 1)]
        finally:
            plain.close(0)
            curve.close(0)
