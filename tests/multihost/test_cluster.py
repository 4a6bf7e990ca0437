"""The multi-host test fixtures themselves: ssh into every host, reach hosts and the
controller over TCP, cut links, kill hosts, and leave nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from cluster import NetnsCluster, remove_stale_clusters
from system import pid_alive, run_then_sigkill_itself

MakeCluster = Callable[[int], NetnsCluster]

# Listens on $ADDRESS:$PORT, prints "listening" once bound, answers each
# connection with this host's name.
TCP_SERVER = """
import os, socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(socket.gethostname().encode())
    c.close()
"""
# Connects to $ADDRESS:$PORT and prints what the server sent.
TCP_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as c:
    print(c.recv(100).decode())
"""
PORT = 7411


def start_server_on_host(cluster: NetnsCluster, i: int) -> subprocess.Popen[str]:
    """A TCP_SERVER on host ``i``'s address, started over ssh like a launcher would."""
    argv = [sys.executable, "-c", TCP_SERVER, cluster.hosts[i], str(PORT)]
    server = subprocess.Popen(
        cluster.ssh_argv(i, argv), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    return server


def connect_from_root(address: str, timeout: float = 3.0) -> str:
    with socket.create_connection((address, PORT), timeout=timeout) as c:
        return c.recv(100).decode()


def assert_all_dead(pids: list[int]) -> None:
    deadline = time.monotonic() + 30  # an event, not a delay: under load it comes late
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in pids if pid_alive(p)], "processes survived"


def test_ssh_runs_this_interpreter_on_every_host(cluster4: NetnsCluster) -> None:
    # What a launcher does: ssh <address> <sys.executable> ...; every host must see
    # monarch_nb, its own name and address, and the controller's address as peer.
    probe = (
        "import monarch_nb, os, socket;"
        "print(socket.gethostname(), os.environ['SSH_CONNECTION'], monarch_nb.__name__)"
    )
    sessions = [
        subprocess.Popen(
            cluster4.ssh_argv(i, [sys.executable, "-c", probe]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for i in range(4)
    ]
    for i, session in enumerate(sessions):
        out, err = session.communicate(timeout=30)
        assert session.returncode == 0, err
        hostname, client, _, server, _, module = out.split()
        assert (hostname, client, server, module) == (
            f"host{i}",
            cluster4.controller_address,
            cluster4.hosts[i],
            "monarch_nb",
        )


def test_host_names_in_ssh_config_and_hosts_files(cluster2: NetnsCluster) -> None:
    # `ssh -F config host1` works like the address; host0 resolves host1 and the controller.
    done = subprocess.run(
        ["ssh", *cluster2.ssh_options, "host1", "hostname"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "host1"), done.stderr
    resolved = cluster2.ssh(0, "getent hosts host1 controller").stdout.split()
    assert resolved == [cluster2.hosts[1], "host1", cluster2.controller_address, "controller"]


def test_tcp_between_hosts_and_controller(cluster4: NetnsCluster) -> None:
    servers = [start_server_on_host(cluster4, i) for i in range(4)]
    try:
        # Controller (root namespace) -> every host.
        assert [connect_from_root(a) for a in cluster4.hosts] == cluster4.hostnames
        # Every host -> the next host.
        for i in range(4):
            j = (i + 1) % 4
            client = [sys.executable, "-c", TCP_CLIENT, cluster4.hosts[j], str(PORT)]
            assert cluster4.run(i, client, check=True).stdout.strip() == f"host{j}"
    finally:
        for i in range(4):
            cluster4.kill_host(i)  # the servers, their sessions; not the sshds
        for server in servers:
            server.communicate(timeout=10)  # reaps it and closes its pipe
    # Every host -> a server of the controller's, bound to the controller address.
    with socket.create_server((cluster4.controller_address, 0)) as listener:
        port = listener.getsockname()[1]
        client = [sys.executable, "-c", TCP_CLIENT, cluster4.controller_address, str(port)]
        for i in range(4):
            with subprocess.Popen(cluster4.host_argv(i, client), stdout=subprocess.PIPE) as session:
                conn, (peer, _) = listener.accept()
                with conn:
                    assert peer == cluster4.hosts[i]
                    conn.sendall(b"controller")
                assert session.communicate(timeout=10)[0].strip() == b"controller"


def test_cut_link_isolates_a_host_until_restored(netns_cluster: MakeCluster) -> None:
    cluster = netns_cluster(2)
    server = start_server_on_host(cluster, 0)
    # A session already open on host 1, as a launcher keeps one per host.
    session = subprocess.Popen(cluster.ssh_argv(0, "sleep 60"), stdin=subprocess.DEVNULL)
    time.sleep(0.5)
    cluster.cut_link(0)
    # A timeout, or "no route to host" once ARP gives up: never an answer.
    with pytest.raises(OSError, match=r"timed out|No route to host"):
        connect_from_root(cluster.hosts[0], timeout=1)
    client = [sys.executable, "-c", TCP_CLIENT, cluster.hosts[0], str(PORT)]
    assert cluster.run(1, client).returncode != 0  # host 1 cannot reach it either
    # ServerAliveInterval 1 x ServerAliveCountMax 3 ends the open session in ~4 s.
    started = time.monotonic()
    assert session.wait(timeout=10) == 255
    assert time.monotonic() - started < 8
    cluster.restore_link(0)
    assert connect_from_root(cluster.hosts[0]) == "host0"
    assert cluster.ssh(0, "hostname").stdout.strip() == "host0"
    server.kill()
    server.communicate()


def test_kill_host_kills_its_processes_and_keeps_sshd(netns_cluster: MakeCluster) -> None:
    cluster = netns_cluster(2)
    session = subprocess.Popen(cluster.ssh_argv(0, "sleep 300"), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _sleepers(cluster, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        sleepers = _sleepers(cluster, 0)
        assert len(sleepers) == 1
        sshd = cluster.sshd_pid(0)
        killed = cluster.kill_host(0)
        assert sleepers[0] in killed
        assert sshd not in killed
        assert_all_dead(killed)
        assert session.wait(timeout=10) == 255  # its sshd session died with the host
    finally:  # failed early, it must not outlive the test (nor warn in the next one)
        if session.poll() is None:
            session.kill()
            session.wait()
    assert cluster.pids(0) == [sshd]
    assert cluster.ssh(0, "hostname").stdout.strip() == "host0"
    assert cluster.pids(1) == [cluster.sshd_pid(1)]  # the other host untouched


def test_kill_host_with_sshd_then_restart_it(netns_cluster: MakeCluster) -> None:
    cluster = netns_cluster(1)
    old_sshd = cluster.sshd_pid(0)
    assert old_sshd in cluster.kill_host(0, include_sshd=True)
    assert cluster.pids(0) == []
    assert cluster.sshd_pid(0) is None
    refused = cluster.ssh(0, "true")
    assert refused.returncode == 255
    assert "refused" in refused.stderr
    cluster.start_sshd(0)
    assert cluster.ssh(0, "hostname").stdout.strip() == "host0"


def test_close_removes_everything(netns_cluster: MakeCluster) -> None:
    cluster = netns_cluster(2)
    namespaces = [cluster.namespace(i) for i in range(2)]
    veths = [cluster.veth(i) for i in range(2)]
    # A process that detaches from its ssh session (as a daemonizing agent
    # would) must be found and killed by close() all the same.
    detached = cluster.ssh(1, "setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $!")
    pid = int(detached.stdout)
    assert pid in cluster.pids(1)
    cluster.close()
    assert not pid_alive(pid)
    assert cluster.leftovers() == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert not [ns for ns in namespaces if ns in listed]
    assert not [v for v in veths if v in links]
    assert not os.path.exists(cluster.workdir)


def test_clusters_built_in_parallel_do_not_collide(netns_cluster: MakeCluster) -> None:
    first, second = netns_cluster(1), netns_cluster(1)
    assert first.controller_address != second.controller_address
    assert first.ssh(0, "true").returncode == 0
    assert second.ssh(0, "true").returncode == 0


def test_a_killed_runs_cluster_is_removed_by_the_next(netns_cluster: MakeCluster) -> None:
    # A test process SIGKILLed mid-run (pytest-timeout, OOM) cannot clean up;
    # the next cluster built removes what it left.
    namespace, sshd = run_then_sigkill_itself(
        "import cluster; c = cluster.NetnsCluster(1); print(c.namespace(0), c.sshd_pid(0))"
    )
    assert namespace in subprocess.run(["ip", "netns", "list"], capture_output=True).stdout.decode()
    assert namespace.rsplit("-", 1)[0] in remove_stale_clusters()
    assert (
        namespace
        not in subprocess.run(["ip", "netns", "list"], capture_output=True).stdout.decode()
    )
    assert not pid_alive(int(sshd))


def _sleepers(cluster: NetnsCluster, i: int) -> list[int]:
    found = []
    for pid in cluster.pids(i):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", b"300"]:
                    found.append(pid)
        except (FileNotFoundError, ProcessLookupError):  # exited since it was listed
            pass
    return found
