"""Monarch's simple bootstrap, as a Monarch user writes it: each host runs
``run_worker_loop_forever(address=..., ca=...)`` with no index, and the client's
``attach_to_workers(workers=[...], ca=...)`` is a HostMesh in the order of
``workers``. Real worker-loop processes (one on TCP, one on a Unix socket), a
real controller; every process they started is checked gone at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest
from process_checks import wait_for_exit

from monarch_nb import MeshFailure, MeshUsageError, SerializationError
from monarch_nb._wire import _keys
from monarch_nb.actor import Actor, attach_to_workers, endpoint, run_worker_loop_forever

pytestmark = pytest.mark.timeout(180)

_LOOP = "from monarch_nb.actor import run_worker_loop_forever; run_worker_loop_forever(address={address!r}, ca={ca!r})"  # noqa: E501


class Hello(Actor):
    @endpoint
    def host_pid(self) -> int:
        return os.getppid()  # the worker loop that started this process

    @endpoint
    def takes(self, value: object) -> None:
        pass


def _loop(address: str, ca: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _LOOP.format(address=address, ca=ca)])


@pytest.fixture(scope="module")
def loops(tmp_path_factory) -> Iterator[tuple[list[subprocess.Popen], list[str], str]]:
    """Two worker loops started at once, as Monarch's test does (nobody waits for
    them to listen: attaching waits); the key file they and the client share."""
    tmp = tmp_path_factory.mktemp("loops")
    key = str(tmp / "agent.key")
    _keys.write_key_file(key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    addresses = [f"tcp://127.0.0.1:{port}", f"ipc://{tmp}/w1"]
    procs = [_loop(address, key) for address in addresses]
    try:
        yield procs, addresses, key
    finally:
        everything = set()
        for proc in procs:
            try:
                everything |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
            everything.add(proc.pid)
            proc.terminate()  # SIGTERM: the loop ends, its workers with it
        for proc in procs:
            assert proc.wait(30) == 0
        assert not wait_for_exit(everything, 30), "a worker loop's process outlived it"


def test_hosts_are_in_the_order_of_workers_each_session(loops) -> None:
    procs, addresses, key = loops
    pids = [p.pid for p in procs]
    for order in ([1, 0], [0, 1]):  # the index is given at attach, per session
        hosts = attach_to_workers(ca=key, workers=[addresses[i] for i in order])
        assert dict(hosts.extent) == {"hosts": 2}
        assert hosts.initialized.get(timeout=10) is True
        procs_mesh = hosts.spawn_procs()
        hello = procs_mesh.spawn("hello", Hello)
        assert list(hello.host_pid.call().get(timeout=60).values()) == [pids[i] for i in order]
        workers = {c.pid for p in procs for c in psutil.Process(p.pid).children()}
        if order == [1, 0]:
            # An agent-driven host mesh cannot travel to an actor: said before sending.
            with pytest.raises(SerializationError, match="pass the ProcMesh to the actor"):
                hello.takes.call(hosts).get(timeout=60)
            # A second stop of a process mesh does nothing, as Monarch's.
            assert procs_mesh.stop().get(timeout=60) is None
            assert procs_mesh.stop().get(timeout=60) is None
            assert procs_mesh.state == "stopped"
        assert hosts.shutdown().get() is None
        assert not wait_for_exit(workers, 30)  # the session's processes are gone
        # A second shutdown raises at its result, in Monarch's words; so does stop().
        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            hosts.shutdown().get()
        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            hosts.stop().get()
    assert all(p.poll() is None for p in procs)  # they wait for the next client


def _fail_on_rank_1() -> None:
    if os.environ["RANK"] == "1":
        raise RuntimeError("no CUDA for rank 1")


def test_a_bootstrap_failure_on_another_host_surfaces_at_initialized(loops) -> None:
    _, addresses, key = loops
    hosts = attach_to_workers(ca=key, workers=addresses)
    try:
        procs = hosts.spawn_procs(bootstrap=_fail_on_rank_1)  # returns, as Monarch's
        with pytest.raises(MeshFailure, match="no CUDA for rank 1"):
            procs.initialized.get(timeout=10)
        with pytest.raises(MeshFailure, match="no CUDA for rank 1"):
            procs.spawn("hello", Hello)
        assert not wait_for_exit(set(procs.pids), 30)
    finally:
        hosts.shutdown()


def test_a_worker_loop_ends_its_processes_when_stopped(loops, tmp_path) -> None:
    _, _, key = loops
    address = f"ipc://{tmp_path}/alone"
    loop = _loop(address, key)
    hosts = attach_to_workers(ca=key, workers=[address])
    procs = hosts.spawn_procs(per_host={"procs": 2})
    workers = set(procs.pids)
    assert len(workers) == 2
    loop.send_signal(signal.SIGTERM)  # whatever started the host stops it
    assert loop.wait(30) == 0
    assert not wait_for_exit(workers, 30)
    hosts.shutdown()


def test_a_worker_loop_serves_on_a_socket_it_was_handed(loops) -> None:
    """Monarch's tcp://HOST:fdN: the socket is bound by whoever starts the loop."""
    _, _, key = loops
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port, fd = sock.getsockname()[1], sock.fileno()
    address = f"tcp://127.0.0.1:fd{fd}"
    loop = subprocess.Popen(
        [sys.executable, "-c", _LOOP.format(address=address, ca=key)], pass_fds=(fd,)
    )
    sock.close()  # the loop's now
    try:
        hosts = attach_to_workers(ca=key, workers=[f"tcp://127.0.0.1:{port}"])
        hello = hosts.spawn_procs().spawn("hello", Hello)
        assert hello.host_pid.call().get(timeout=60).item() == loop.pid
        hosts.shutdown()
    finally:
        workers = {c.pid for c in psutil.Process(loop.pid).children(recursive=True)}
        loop.terminate()
        assert loop.wait(30) == 0
        assert not wait_for_exit(workers, 30)


def test_trust_all_connections_is_refused_saying_what_to_do() -> None:
    for call in (
        lambda: run_worker_loop_forever(address="tcp://127.0.0.1:1", ca="trust_all_connections"),
        lambda: attach_to_workers(ca="trust_all_connections", workers=["tcp://127.0.0.1:1"]),
    ):
        with pytest.raises(MeshUsageError, match="refused") as info:
            call()
        assert "monarch-nb keygen FILE" in str(info.value)
        assert "ca=FILE" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ca": b"secret"}, "path, not its contents"),
        ({"ca": "k", "private_key": b"x"}, "leave private_key out"),
        ({"ca": "k", "workers": "tcp://a:1"}, "list of addresses"),
        ({"ca": "k", "workers": ["http://a:1"]}, "tcp://HOST:PORT or ipc://PATH"),
        ({"ca": "k", "workers": ["tcp://0.0.0.0:7000"]}, "where a worker binds"),
        ({"ca": "k", "workers": ["tcp://127.0.0.1:fd3"]}, "clients dial its port"),
    ],
)
def test_bad_arguments_are_named(kwargs, match) -> None:
    kwargs.setdefault("workers", ["tcp://127.0.0.1:1"])
    with pytest.raises(MeshUsageError, match=match):
        attach_to_workers(**kwargs)


def test_a_key_file_others_can_read_is_refused(tmp_path) -> None:
    key = tmp_path / "agent.key"
    _keys.write_key_file(str(key))
    key.chmod(0o644)
    with pytest.raises(MeshUsageError, match="chmod 600"):
        run_worker_loop_forever(address=f"ipc://{tmp_path}/w", ca=str(key))


def test_monarchs_address_forms_bind_and_dial_the_right_side() -> None:
    from monarch_nb._jobs._worker_loop import _bind_address, _dial_address

    alias = "tcp://node1:7000@tcp://0.0.0.0:7000"
    assert (_bind_address(alias), _dial_address(alias)) == (
        ("tcp://0.0.0.0:7000", None),
        "tcp://node1:7000",
    )
    proc_addr = "service<2MuAHeDjLCEd>@tcp://node1:7000"
    assert _dial_address(proc_addr) == "tcp://node1:7000"
    assert _bind_address("tcp://*:7000") == ("tcp://*:7000", None)
