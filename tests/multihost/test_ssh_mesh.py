"""Meshes across real hosts: each host a network namespace with its own sshd
(cluster.py), the mesh started through the ssh launcher with real ssh, and faults
made the way they happen: a pulled cable, a killed machine."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from process_checks import wait_for_exit

from monarch_nb import MeshFailure, MeshUsageError, RankState, ssh_hosts

HEARTBEAT_TIMEOUT_S = 2.0


def start_hosts(cluster, **kwargs):
    return ssh_hosts(
        cluster.hosts,
        ssh_options=cluster.ssh_options,
        bind=cluster.controller_address,
        **kwargs,
    )


@pytest.fixture(scope="module")
def hosts(cluster2):
    hosts = start_hosts(cluster2)
    yield hosts
    hosts.shutdown()


def test_a_mesh_spans_the_hosts_through_ssh(cluster2, hosts) -> None:
    with hosts.spawn_procs({"procs": 2}) as procs:
        seen = procs.run(
            "import os, socket\n"
            "(socket.gethostname(), os.environ['MASTER_ADDR'], os.environ['GLOO_SOCKET_IFNAME'])"
        )
        names = [name for name, _, _ in seen.values()]
        assert names == [cluster2.hostnames[0]] * 2 + [cluster2.hostnames[1]] * 2
        assert {master for _, master, _ in seen.values()} == {cluster2.hosts[0]}
        assert [r.host for r in procs.status().ranks] == [cluster2.hosts[0]] * 2 + [
            cluster2.hosts[1]
        ] * 2
        # Each agent runs in its host's namespace, not in ours.
        for i, agent in enumerate(hosts._agents.agents):
            assert agent.pid in cluster2.pids(i)
            assert agent.address == cluster2.hosts[i]


def test_gloo_across_hosts(hosts) -> None:
    pytest.importorskip("torch")
    with hosts.spawn_procs({"procs": 2}) as procs:
        result = procs.run(
            textwrap.dedent(
                """
                import torch, torch.distributed as dist
                dist.init_process_group("gloo")
                t = torch.full((3,), float(rank + 1))
                dist.all_reduce(t)
                dist.destroy_process_group()
                t.tolist()
                """
            )
        )
        assert list(result.values()) == [[10.0] * 3] * 4


def test_rdma_between_hosts_goes_over_tcp(hosts) -> None:
    pytest.importorskip("torch")
    with hosts.spawn_procs({"procs": 1}) as procs:
        owner, reader = procs.slice(hosts=0), procs.slice(hosts=1)
        owner.run(
            "import torch\n"
            "from monarch_nb.native import RDMABuffer\n"
            "weights = torch.arange(1 << 18, dtype=torch.float32)\n"
            "buf = RDMABuffer(weights)"
        )
        handle = owner.pull("buf")[0]
        reader.push(handle=handle)
        total = reader.run(
            "import torch\n"
            "try:\n"
            "    handle.read_into(torch.empty(1 << 18), transport='local').get()\n"
            "    local = 'allowed'\n"
            "except ValueError as exc:\n"
            "    local = str(exc)\n"
            "dst = torch.empty(1 << 18)\n"
            "handle.read_into(dst).get(timeout=30)\n"
            "(float(dst.sum()), local)"
        )[1]
        assert total[0] == float(sum(range(1 << 18)))
        assert "another host" in total[1]  # cross-memory attach is not offered across hosts


def test_a_cut_cable_fails_exactly_that_hosts_ranks_and_its_agent_cleans_up(
    netns_cluster,
) -> None:
    cluster = netns_cluster(2)
    hosts = start_hosts(cluster, heartbeat_timeout=HEARTBEAT_TIMEOUT_S)
    try:
        procs = hosts.spawn_procs({"procs": 2})
        call = procs.exec("import time; time.sleep(60)")
        cluster.cut_link(1)
        started = time.monotonic()
        with pytest.raises(MeshFailure, match=rf"host {cluster.hosts[1]} .*stopped answering"):
            call.get(timeout=30)
        assert time.monotonic() - started <= HEARTBEAT_TIMEOUT_S + 3.0  # + a tick, loaded CI
        assert procs.failure.ranks == (2, 3)
        states = [r.state for r in procs.status().ranks]
        assert states[2:] == [RankState.DEAD, RankState.DEAD]
        assert RankState.DEAD not in states[:2]
        # On the far side of the cut, the agent heard nothing from us either: it
        # kills its workers and exits by itself. Only sshd (and the ssh session's
        # server side, which waits for the cable) may remain there.
        agent_pid = hosts._agents.agents[1].pid
        assert not wait_for_exit({agent_pid}, HEARTBEAT_TIMEOUT_S + 5)
        procs.stop()
    finally:
        hosts.shutdown()
        cluster.restore_link(1)


def test_a_killed_host_fails_its_ranks_at_once(netns_cluster) -> None:
    cluster = netns_cluster(2)
    hosts = start_hosts(cluster, heartbeat_timeout=30.0)  # so only the ssh end can tell
    try:
        procs = hosts.spawn_procs({"procs": 1})
        call = procs.exec("import time; time.sleep(60)")
        killed = cluster.kill_host(0)  # the agent and its workers, as in a power cut
        assert hosts._agents.agents[0].pid in killed
        started = time.monotonic()
        with pytest.raises(MeshFailure, match=rf"host {cluster.hosts[0]} .*lost its agent"):
            call.get(timeout=30)
        assert time.monotonic() - started < 5.0  # not the 30 s heartbeat timeout
        assert procs.failure.ranks == (0,)
        procs.stop()
    finally:
        hosts.shutdown()


@pytest.mark.parametrize("reverse", ["", "--reverse"])
def test_notebook_start_over_ssh(cluster2, reverse) -> None:
    from kernel_utils import Kernel, plain

    with Kernel() as kernel:
        kernel.ok("%load_ext monarch_nb")
        options = " ".join(f"--ssh-option={o}" for o in cluster2.ssh_options)
        kernel.ok(
            f"%mesh start --ssh {','.join(cluster2.hosts)} {options} {reverse} --procs 1 "
            "--no-dashboard",
            timeout=120,
        )
        reply = kernel.ok("%%mesh\nimport socket\nsocket.gethostname()")
        text = plain(reply.text())
        for name in cluster2.hostnames:
            assert name in text
        kernel.ok("%mesh stop")
        left = kernel.ok(
            "import psutil\n"
            "print([' '.join(p.cmdline()) for p in psutil.Process().children(recursive=True)\n"
            "       if p.status() != psutil.STATUS_ZOMBIE])"
        )
        assert "monarch_nb.agent" not in left.stream()  # no ssh to an agent is left


def test_the_agent_runs_the_remote_python(cluster2) -> None:
    # python= chooses the interpreter on the hosts; a wrong one fails with what
    # the host said.
    with pytest.raises(MeshFailure, match=r"(?s)ssh to .* ended .*(No such file|not found)"):
        start_hosts(cluster2, python="/nonexistent/python3", timeout=30)
    assert os.path.exists(sys.executable)


def test_tensor_engine_across_hosts(hosts) -> None:
    # Mesh tensors on ranks of two hosts: a collective along "hosts" runs over
    # gloo between them, and to_mesh() moves bytes host to host over the data
    # plane's TCP transport.
    torch = pytest.importorskip("torch")
    import monarch_nb

    with hosts.spawn_procs({"procs": 1}) as procs:
        with procs.activate():
            x = torch.ones(4) * 2
            total = x.reduce("hosts", "sum")
        assert monarch_nb.inspect(total, hosts=1, procs=0).tolist() == [4.0] * 4
        with procs.slice(hosts=0).activate():
            h = torch.arange(1 << 16, dtype=torch.float32)
        moved = h.to_mesh(procs.slice(hosts=1))
        assert monarch_nb.inspect(moved.sum(), procs=0).item() == float(sum(range(1 << 16)))


def test_actors_on_different_hosts_call_each_other(hosts, request) -> None:
    import actor_hosts
    import cloudpickle
    from actor_hosts import Caller, Leaf

    from monarch_nb import Channel

    # The hosts have no copy of the tests: their classes travel by value.
    cloudpickle.register_pickle_by_value(actor_hosts)
    request.addfinalizer(lambda: cloudpickle.unregister_pickle_by_value(actor_hosts))

    with hosts.spawn_procs({"procs": 1}) as procs:
        leaves = procs.spawn("leaves", Leaf)
        callers = procs.spawn("callers", Caller, leaves)
        got = callers.call_all.call(3).get(timeout=120)
        assert [sorted(v) for v in got.values()] == [[(0, 3), (1, 3)]] * 2
        # Each rank listens on its own host's address, not on loopback.
        ref = leaves.__reduce__()[1][0]
        assert {ref.procs.address(r).rsplit(":", 1)[0] for r in range(2)} == {
            f"tcp://{address}" for address in hosts.hosts
        }
        port, receiver = Channel.open()
        callers.send_to.call(port).get(timeout=120)
        assert sorted(receiver.recv().get(timeout=120) for _ in range(2)) == [0, 1]


_NO_RSYNC = pytest.mark.skipif(
    shutil.which("rsync") is None,
    reason="rsync is not installed (Debian's rsync; .ci/install_multihost.sh installs it)",
)


@pytest.mark.parametrize("transport", [pytest.param("rsync", marks=_NO_RSYNC), "agent"])
def test_sync_workspace_ships_a_notebooks_code_to_hosts_without_a_shared_file_system(
    hosts, cluster2, tmp_path, transport
):
    project = tmp_path / "project"
    module = f"shipped_{transport}"  # each its own: both workspaces stay on the path
    (project / "data").mkdir(parents=True)
    (project / f"{module}.py").write_text("GREETING = 'from the notebook'\n")
    (project / "data" / "table.csv").write_text("a,b\n1,2\n")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("left out\n")
    # Each host sees its own empty tmpfs at private_dir (no shared file system there).
    dest = os.path.join(cluster2.private_dir, f"project-{transport}")
    copies = hosts.sync_workspace(str(project), dest=dest, transport=transport)
    assert [(c.host, c.path, c.files, c.transport) for c in copies] == [
        (h, dest, 2, transport) for h in hosts.hosts
    ]
    assert not os.path.exists(dest)  # not on this machine: on each host's own file system
    with hosts.spawn_procs({"procs": 1}) as procs:
        seen = procs.run(
            f"import os, {module}\n"
            f"({module}.GREETING, open({dest!r} + '/data/table.csv').read(),"
            f" os.path.exists({dest!r} + '/.git'))"
        )
        assert list(seen.values()) == [("from the notebook", "a,b\n1,2\n", False)] * 2
    # A second sync after an edit: the running mesh's next processes see it.
    (project / f"{module}.py").write_text("GREETING = 'edited'\n")
    again = hosts.sync_workspace(str(project), dest=dest, transport=transport)
    # rsync sends only the file that changed; the agent sends the whole archive.
    assert [c.files for c in again] == ([1, 1] if transport == "rsync" else [2, 2])
    with hosts.spawn_procs({"procs": 1}) as procs:
        assert list(procs.run(f"import {module}\n{module}.GREETING").values()) == ["edited"] * 2


@_NO_RSYNC
def test_sync_workspace_goes_by_rsync_where_it_can(hosts, cluster2, tmp_path):
    (tmp_path / "one.py").write_text("X = 1\n")
    dest = os.path.join(cluster2.private_dir, "auto")
    copies = hosts.sync_workspace(str(tmp_path / "one.py"), dest=dest)  # transport="auto"
    assert [c.transport for c in copies] == ["rsync", "rsync"]  # rsync is installed here
    with pytest.raises(MeshUsageError, match=r"transport='scp'\): use 'auto', 'rsync' or"):
        hosts.sync_workspace(str(tmp_path), transport="scp")


def test_sync_workspace_says_what_it_cannot_send(hosts, tmp_path):
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        hosts.sync_workspace(str(tmp_path / "missing"))


def test_env_setup_runs_before_the_agent_and_python_may_name_a_venv(
    cluster2, host_venv, env_script
):
    hosts = start_hosts(cluster2, python=str(host_venv), env_setup=f"source {env_script}")
    try:
        with hosts.spawn_procs({"procs": 1}) as procs:
            seen = procs.run("import os, sys\n(os.environ['MNB_FROM_ENV_SETUP'], sys.prefix)")
        assert list(seen.values()) == [("loaded", str(host_venv))] * 2
    finally:
        hosts.shutdown()


def test_a_failing_env_setup_is_named(cluster2):
    with pytest.raises(MeshFailure, match=r"env_setup failed: source /nonexistent/env\.sh"):
        start_hosts(cluster2, env_setup="source /nonexistent/env.sh", timeout=60)


def test_reverse_tunnels_reach_a_controller_the_hosts_cannot_route_to(cluster2, request) -> None:
    import actor_hosts
    import cloudpickle
    from actor_hosts import Caller, Leaf

    from monarch_nb import Channel

    cloudpickle.register_pickle_by_value(actor_hosts)
    request.addfinalizer(lambda: cloudpickle.unregister_pickle_by_value(actor_hosts))
    # The controller listens on loopback only: no host can route to it, only
    # through the ssh that started its agent (a laptop behind NAT).
    hosts = ssh_hosts(cluster2.hosts, ssh_options=cluster2.ssh_options, reverse=True)
    try:
        assert hosts._agents.endpoint.startswith("tcp://127.0.0.1:")
        # The way back is a Unix socket in the host user's private directory (the
        # hosts share this machine's /root): only that user can open it.
        tunnels = os.path.expanduser("~/.monarch_nb/tunnels")
        assert stat.S_IMODE(os.stat(tunnels).st_mode) == 0o700
        sockets = [os.path.join(tunnels, n) for n in os.listdir(tunnels) if n.endswith(".sock")]
        assert len(sockets) >= 4  # two hosts, each the agents' endpoint and the inbox
        assert all(stat.S_ISSOCK(os.stat(path).st_mode) for path in sockets)
        assert _connect_as_nobody(sockets[0]) == "PermissionError"
        # Each agent names its host by the address ssh reached it at, not loopback.
        assert [a.address for a in hosts._agents.agents] == cluster2.hosts
        with hosts.spawn_procs({"procs": 1}) as procs:
            seen = procs.run("import os, socket\n(socket.gethostname(), os.environ['MASTER_ADDR'])")
            assert list(seen.values()) == [(name, cluster2.hosts[0]) for name in cluster2.hostnames]
            leaves = procs.spawn("leaves", Leaf)
            callers = procs.spawn("callers", Caller, leaves)
            got = callers.call_all.call(3).get(timeout=120)  # host to host
            assert [sorted(v) for v in got.values()] == [[(0, 3), (1, 3)]] * 2
            port, receiver = Channel.open()  # ranks to this controller, through the tunnel
            callers.send_to.call(port).get(timeout=120)
            assert sorted(receiver.recv().get(timeout=120) for _ in range(2)) == [0, 1]
    finally:
        hosts.shutdown()
    with pytest.raises(MeshUsageError, match=r"reverse=True, bind='10\.0\.0\.1'.*leave bind out"):
        ssh_hosts(cluster2.hosts, reverse=True, bind="10.0.0.1")


def _connect_as_nobody(path: str) -> str:
    """What another user of the host gets connecting to ``path``: the exception's name."""
    code = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1]); print('connected')\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr[-500:]
