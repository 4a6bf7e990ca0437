"""Elastic meshes: ``resize(procs=n)`` renumbers the survivors of a failure into a
new mesh, ``grow(n)`` adds ranks; each process learns its new rank, world size
and environment, and a torch.distributed loop goes on at the new size.
"""

from __future__ import annotations

import os
import signal

import pytest
from fault_actors import Keeper
from process_checks import wait_for_exit

from monarch_nb import MeshFailure, MeshUsageError, this_host
from monarch_nb.events import EventLog, Output, RankStateChanged

LIMIT_S = 30.0  # generous: this machine is shared and loaded
PLACE = (
    "import os\n"
    "from monarch_nb import current_rank\n"
    "(rank, world_size, point.rank, current_rank().rank,\n"
    " os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'])"
)


@pytest.fixture
def spawn():
    """Start meshes of N ranks; each is stopped at the end, and with it every mesh
    it was resized or grown into (the autouse fixture checks that none is left)."""
    started = []

    def start(n: int):
        procs = this_host().spawn_procs(per_host={"procs": n}, echo_output=False)
        started.append(procs)
        return procs

    yield start
    for procs in started:
        procs.stop()


def _kill(procs, rank: int) -> None:
    """SIGKILL ``rank`` and wait until the controller saw it die."""
    log = EventLog()
    with procs.events.subscribe(log, kinds=(RankStateChanged,)):
        os.kill(procs.pids[rank], signal.SIGKILL)
        log.wait_for(
            RankStateChanged, lambda e: e.rank == rank and e.state == "dead", timeout=LIMIT_S
        )


def test_resize_renumbers_the_survivors_and_keeps_their_namespaces():
    procs = this_host().spawn_procs(per_host={"procs": 4}, echo_output=False)
    pids = set(procs.pids)
    try:
        procs.run("x = rank * 10")
        keepers = procs.spawn("k", Keeper, 7)
        _kill(procs, 1)
        small = procs.resize(procs=2)  # ranks 0 and 2 become 0 and 1; rank 3 stops
        assert small.shape.labels == ("procs",)
        assert small.shape.sizes == (2,)
        assert small.run("x").values() == [0, 20]
        assert small.run(PLACE).values() == [
            (0, 2, 0, 0, "0", "0", "2"),
            (1, 2, 1, 1, "1", "1", "2"),
        ]
        left = wait_for_exit(pids - set(small.pids), LIMIT_S)
        assert not left, f"ranks not kept still run: {left}"
        # The old mesh and its actors say where the processes went.
        with pytest.raises(MeshUsageError, match=r"exec\(\) on process mesh 'procs', which was "):
            procs.run("x")
        moved = r"resized into a mesh of 2 rank\(s\) \(ranks moved: 0->0, 2->1\)"
        with pytest.raises(MeshFailure, match=moved):
            keepers.get.call().get(timeout=LIMIT_S)
        # Actors spawned on the new mesh see the new ranks.
        again = small.spawn("k2", Keeper, 1)
        assert again.get.call().get(timeout=LIMIT_S).values() == [(0, 1), (1, 1)]
        pids.update(small.pids)
    finally:
        procs.stop()  # a resized mesh stops the mesh it became
    assert not wait_for_exit(pids, LIMIT_S)


def test_a_kept_rank_still_busy_with_a_call_given_up_on_is_waited_for(spawn, tmp_path, monkeypatch):
    """A kept rank may still run what its caller gave up on (a collective the dead
    rank left, until torch.distributed's timeout): the resize waits for it that
    long, not only the start timeout, and then renumbers it."""
    import threading

    from stress_actors import Gate

    from monarch_nb._controller import _resize

    monkeypatch.setattr(_resize, "START_TIMEOUT_S", 0.5)
    monkeypatch.setenv("MONARCH_NB_COLLECTIVE_TIMEOUT", "60")
    procs = spawn(2)
    gate_file = str(tmp_path / "open")
    gates = procs.spawn("gates", Gate)
    gates.initialized.get(timeout=60)  # else the cancel may drop the call before it runs
    held = gates.wait.call(gate_file)
    assert held.cancel()  # the ranks go on waiting at the gate; nobody counts them busy
    opener = threading.Timer(2.0, lambda: open(gate_file, "w").close())
    opener.start()
    try:
        again = procs.resize(procs=2)
    finally:
        opener.cancel()
    assert os.path.exists(gate_file), "the resize returned before the ranks were free"
    assert again.run("rank").values() == [0, 1]


def test_grow_adds_ranks_after_the_live_ones(spawn):
    procs = spawn(2)
    procs.run("x = rank + 1")
    big = procs.grow(2)
    assert big.pids[:2] == procs.pids
    assert big.run("globals().get('x')").values() == [1, 2, None, None]
    assert big.run(PLACE).values() == [(r, 4, r, r, str(r), str(r), "4") for r in range(4)]
    ports = big.run("os.environ['MASTER_PORT']").values()
    assert len(set(ports)) == 1
    # Shrinking without a failure keeps the first ranks.
    small = big.resize(procs=1)
    assert small.run("(rank, world_size, x)").values() == [(0, 1, 1)]
    assert not wait_for_exit(set(big.pids[1:]), LIMIT_S)


def test_actors_on_a_resized_mesh_reach_each_other(spawn):
    # Kept processes listen where they did under their old ranks; added ones under
    # the new mesh's name: a reference to the new mesh knows both.
    from actor_hosts import Caller, Leaf

    procs = spawn(3)
    _kill(procs, 0)
    big = procs.resize(procs=2).grow(1)
    leaves = big.spawn("leaves", Leaf)
    callers = big.spawn("callers", Caller, leaves)
    everyone = [(0, 5), (1, 5), (2, 5)]
    assert callers.call_all.call(5).get(timeout=LIMIT_S).values() == [everyone] * 3


def test_a_resized_mesh_restarts_as_any_mesh(spawn):
    procs = spawn(3)
    procs.run("x = rank")
    small = procs.resize(procs=2)
    record = small.restart(ranks=[1])
    assert record.ranks == (1,)
    kept = "import os\n(rank, os.environ['WORLD_SIZE'], globals().get('x'))"
    assert small.run(kept).values() == [(0, "2", 0), (1, "2", None)]
    small.restart()
    assert small.run(PLACE).values() == [(r, 2, r, r, str(r), str(r), "2") for r in range(2)]


def test_resize_refuses_what_it_cannot_do(spawn):
    procs = spawn(2)
    with pytest.raises(MeshUsageError, match=r"has 2 live rank\(s\) \(0, 1\).*use grow\(3\)"):
        procs.resize(procs=5)
    with pytest.raises(MeshUsageError, match=r"resize\(procs=0\): needs an int of at least 1"):
        procs.resize(procs=0)
    with pytest.raises(MeshUsageError, match=r"grow\('1'\): needs an int of at least 1"):
        procs.grow("1")  # type: ignore[arg-type]
    assert procs.run("rank").values() == [0, 1]  # refused: nothing changed
    procs.stop()
    with pytest.raises(MeshUsageError, match=r"resize\(procs=1\): process mesh 'procs' was stop"):
        procs.resize(procs=1)


TRAIN = """
import datetime, time, torch, torch.distributed as dist
shard = float((rank + 1) ** 2)  # this rank's gradient: its data, kept across a resize
w = torch.zeros(1)
steps = []

def train(n):
    global w
    for _ in range(n):
        g = torch.tensor([shard])
        dist.all_reduce(g)
        g /= dist.get_world_size()
        w -= 0.1 * g
        steps.append((dist.get_world_size(), g.item()))
        if rank == 0 and len(steps) == 3:
            print("three steps", flush=True)
        time.sleep(0.01)
"""
JOIN = (
    "assert not dist.is_initialized()  # a resize left the old world's group\n"
    "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=30))\n"
)
STEPS = (
    "w0 = w.item()\ntrain(3)\n(dist.get_rank(), dist.get_world_size(), w0 - w.item(), steps[-3:])"
)


@pytest.mark.slow
def test_a_resize_during_a_ddp_loop(spawn):
    pytest.importorskip("torch")
    procs = spawn(3)
    log = EventLog()
    with procs.events.subscribe(log, kinds=(Output,)):
        procs.run(TRAIN + JOIN, timeout=LIMIT_S)
        loop = procs.exec("train(100_000)")
        log.wait_for(Output, lambda e: e.line == "three steps", timeout=LIMIT_S)
    os.kill(procs.pids[1], signal.SIGKILL)  # rank 1 dies inside the loop
    with pytest.raises(MeshFailure, match=r"rank 1 \(pid \d+\) .* SIGKILL"):
        loop.get(timeout=LIMIT_S)
    # The survivors (ranks 0 and 2, gradients 1 and 9) go on as a world of 2.
    small = procs.resize(procs=2)
    # fail_fast: a rank that cannot join fails the test with its own error at
    # once, instead of the others waiting in the rendezvous until the timeout.
    small.run(JOIN, timeout=LIMIT_S, fail_fast=True)
    assert small.run(STEPS, timeout=LIMIT_S).values() == [
        (r, 2, pytest.approx(1.5), [(2, 5.0)] * 3) for r in range(2)
    ]
    # One rank more: it gets the training code, then every rank rejoins.
    big = small.grow(1)
    big.slice(procs=[2]).run(TRAIN, timeout=LIMIT_S)
    big.run(JOIN, timeout=LIMIT_S, fail_fast=True)
    mean = pytest.approx(19 / 3)  # gradients 1, 9 and 9: the new rank 2's is 9
    assert big.run(STEPS, timeout=LIMIT_S).values() == [
        (r, 3, pytest.approx(0.3 * 19 / 3), [(3, mean)] * 3) for r in range(3)
    ]


@pytest.mark.slow
def test_mesh_resize_and_grow_in_a_notebook_with_torch_distributed():
    pytest.importorskip("torch")
    from kernel_utils import Kernel

    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 3 --dist gloo --no-dashboard", timeout=120)
        k.ok("%%mesh\nkept = rank * 10")
        k.ok("from monarch_nb import current_mesh\nd = current_mesh().dashboard()")
        reply = k.ok("%mesh resize --procs 2", timeout=120)
        assert "mesh 'mesh' now has 2 rank(s)" in reply.text()
        total = "%%mesh\nx = torch.ones(1)\ndist.all_reduce(x)\n(rank, world_size, kept, int(x))"
        assert k.ok(total).text() == "[0] (0, 2, 0, 2)\n[1] (1, 2, 10, 2)\n"
        k.ok("%mesh grow 1", timeout=120)
        total = total.replace("kept", "globals().get('kept')")
        assert k.ok(total).text() == "[0] (0, 3, 0, 3)\n[1] (1, 3, 10, 3)\n[2] (2, 3, None, 3)\n"
        assert "running · 3 ranks" in k.ok("%mesh status").text()
        # The dashboard shown before follows: a tile per rank of the new mesh.
        shown = (
            "d.wait_until(lambda d: d.grid.rows == [(0, 1, 2)] and 'idle' in d.grid.tile(2), 30)"
        )
        assert k.ok(f"print({shown})").stream() == "True\n"
        k.ok("%mesh stop")


@pytest.mark.slow
def test_the_tensor_engine_runs_on_a_resized_and_grown_mesh(spawn):
    torch = pytest.importorskip("torch")
    from monarch_nb import inspect

    mesh = spawn(3)
    sums = []
    for change in (lambda m: m, lambda m: m.resize(procs=2), lambda m: m.grow(1)):
        mesh = change(mesh)
        with mesh.activate():
            total = torch.ones(2).reduce("procs", "sum")
        sums.append(inspect(total).tolist())
    assert sums == [[3.0, 3.0], [2.0, 2.0], [3.0, 3.0]]
