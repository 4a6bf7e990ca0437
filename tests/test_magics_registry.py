"""magics/_registry.py: the Python face of every magic, without IPython."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from monarch_nb import Actor, MeshUsageError, RemoteError, endpoint
from monarch_nb.magics import CellHandle, NotebookMesh, current_mesh, start_mesh
from monarch_nb.magics._registry import REGISTRY
from monarch_nb.widgets._render import work_text

pytestmark = pytest.mark.timeout(60)


class Doubler(Actor):
    @endpoint
    def double(self, x: int) -> int:
        return 2 * x


@pytest.fixture
def mesh() -> Iterator[NotebookMesh]:
    mesh = start_mesh(procs=2, name="reg")
    yield mesh
    REGISTRY.stop_all()


def test_run_returns_values_and_keeps_a_namespace_per_rank(mesh):
    assert mesh.run("y = rank * 10").values() == [None, None]
    assert mesh.run("y + world_size").values() == [2, 12]
    assert mesh.run("point['procs'], local_rank").values() == [(0, 0), (1, 1)]


def test_syntax_error_is_raised_locally_before_sending(mesh):
    with pytest.raises(SyntaxError) as info:
        mesh.run("x = 1\nx = (")
    assert info.value.lineno == 2
    assert mesh.procs.busy_ranks() == []


def test_remote_error_names_the_rank_and_mesh_stays_usable(mesh):
    with pytest.raises(RemoteError, match="rank 1: ZeroDivisionError") as info:
        mesh.run("1 / rank if rank == 0 else 1 / 0")
    assert info.value.ranks == (0, 1) or info.value.ranks == (1,)
    assert mesh.run("rank").values() == [0, 1]


def test_output_is_prefixed_by_rank_and_ordered_on_request(mesh, capsys):
    mesh.run("print('hi', rank)", ordered=True)
    assert capsys.readouterr().out == "[0] hi 0\n[1] hi 1\n"


def test_push_pull_and_selection(mesh):
    mesh.push({"a": 1}, b=[2])
    assert mesh.pull("b").values() == [[2], [2]]
    mesh.push(a=5, ranks="1")
    assert mesh.pull("a").values() == [1, 5]
    assert mesh.pull("a", where="procs=1").values() == [5]
    with pytest.raises(RemoteError, match="name 'nope' is not defined on this rank"):
        mesh.pull("nope")


def test_non_blocking_run_returns_a_handle(mesh):
    handle = mesh.run("import time\ntime.sleep(0.2)\nrank", block=False)
    assert isinstance(handle, CellHandle)
    assert handle.get(timeout=30).values() == [0, 1]
    assert handle.done()
    assert "done" in repr(handle)


def test_actors_share_the_processes_of_the_cells(mesh):
    doublers = mesh.spawn("d", Doubler)
    assert doublers.double.call(4).get(timeout=30).values() == [8, 8]
    pids = mesh.run("import os\nos.getpid()").values()
    assert pids == mesh.procs.pids


def test_registry_names_default_and_errors(mesh):
    assert current_mesh() is mesh
    assert current_mesh("reg") is mesh
    with pytest.raises(MeshUsageError, match="already running"):
        start_mesh(procs=1, name="reg")
    with pytest.raises(MeshUsageError, match="no mesh named 'x'; running meshes: 'reg'"):
        current_mesh("x")
    second = start_mesh(procs=1)
    assert current_mesh() is second
    assert second.name == "mesh"
    second.stop()
    assert current_mesh() is mesh


def test_status_reports_each_rank(mesh):
    status = mesh.status()
    assert [r.rank for r in status.ranks] == [0, 1]
    assert [r.pid for r in status.ranks] == mesh.procs.pids
    assert {r.state for r in status.ranks} == {"idle"}
    assert {r.work for r in status.ranks} == {""}
    handle = mesh.run("import time\ntime.sleep(0.5)", block=False)
    busy = mesh.status().ranks
    assert {r.state for r in busy} == {"busy"}
    assert all(work_text(r).startswith("%%mesh cell [") for r in busy)
    handle.get(timeout=30)


def test_restart_gives_fresh_namespaces(mesh):
    mesh.push(z=1)
    old = mesh.procs.pids
    mesh.restart()
    assert mesh.procs.pids != old
    with pytest.raises(RemoteError, match="'z' is not defined"):
        mesh.pull("z")


def test_start_validates_options():
    with pytest.raises(MeshUsageError, match=r"dist must be one of .* got .mpi."):
        start_mesh(procs=1, dist="mpi")
    with pytest.raises(MeshUsageError, match="not both"):
        start_mesh(procs=1, gpus=1)
    with pytest.raises(MeshUsageError, match="no mesh is running"):
        current_mesh()


def test_logs_reads_the_selected_ranks_files_as_percent_mesh_logs_does(mesh):
    from monarch_nb.magics import _options
    from monarch_nb.widgets._render import LogView

    mesh.run("print(f'loss {rank}')\nprint('other')")
    args = _options.parse(_options.logs_options, "--ranks 1 --grep loss --since 5m --tail 5")
    lines = mesh.logs(
        ranks=args.ranks, where=args.where, grep=args.grep, since=args.since, tail=args.tail
    )
    assert [(line.rank, line.text) for line in lines] == [(1, "loss 1")]
    assert repr(LogView(lines)).startswith("[1] ")
    assert repr(LogView(lines)).endswith(" loss 1")
    assert repr(LogView([])) == "no log lines matched"
    assert [line.rank for line in mesh.logs(where="procs=0", grep="loss")] == [0]
    with pytest.raises(MeshUsageError, match="give --ranks or --where, not both"):
        mesh.logs(ranks="0", where="procs=0")


def test_logging_option_folds_or_drops_a_cells_lines(mesh, capsys):
    capsys.readouterr()
    mesh.procs.logging_option(aggregate_window_sec=60)  # folded when the cell ends
    mesh.run("print('epoch 3 done')\nprint(f'only {rank}')")
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "[0-1] epoch 3 done"
    assert sorted(out.splitlines()[1:]) == ["[0] only 0", "[1] only 1"]
    mesh.procs.logging_option(stream_to_client=False)
    mesh.run("print('quiet')")
    assert capsys.readouterr().out == ""
    assert sorted(line.rank for line in mesh.logs(grep="quiet")) == [0, 1]  # in the files
    mesh.procs.logging_option()
    mesh.run("print('loud')")
    assert sorted(capsys.readouterr().out.splitlines()) == ["[0] loud", "[1] loud"]
