"""Monarch's monarch.job.spmd: serve() a torchrun command once, run_spmd() it as
often as wanted, each run on fresh ranks with torchrun's environment; a saved
job comes back with job_load(); bad commands are refused before anything
starts. conftest checks that no process outlives a test."""

from __future__ import annotations

import json
import os
import textwrap
from types import SimpleNamespace

import pytest

from monarch_nb import MeshUsageError, RemoteError
from monarch_nb.job import LocalJob
from monarch_nb.job.spmd import SPMDJob, job_load, serve

# A torchrun-style script without torch: each rank writes what torchrun gave it.
_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT")
    record = {n: os.environ[n] for n in names}
    record.update(argv=sys.argv[1:], version=VERSION, main=__name__, pid=os.getpid())
    with open(os.path.join(OUT, "rank%s.json" % os.environ["RANK"]), "w") as f:
        json.dump(record, f)
    """
)


def _write_script(path, out, version):
    path.write_text(f"OUT = {str(out)!r}\nVERSION = {version}\n" + _SCRIPT)


def _records(out):
    return {
        int(p.name[4:-5]): json.loads(p.read_text())
        for p in out.iterdir()
        if p.name.startswith("rank")
    }


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A private cwd: serve() saves the job under ./.monarch_nb."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    return tmp_path


def test_a_served_command_runs_again_on_fresh_ranks_and_comes_back_with_job_load(workdir):
    out, script = workdir / "out", workdir / "train.py"
    _write_script(script, out, version=1)
    job = serve(
        ["torchrun", "--nproc-per-node=2", "--standalone", str(script), "--lr", "0.1"],
        scheduler="local_cwd",
    )
    job.run_spmd(timeout=120)
    first = _records(out)
    assert sorted(first) == [0, 1]
    for rank, record in first.items():
        assert record["LOCAL_RANK"] == str(rank)
        assert record["WORLD_SIZE"] == record["LOCAL_WORLD_SIZE"] == "2"
        assert record["argv"] == ["--lr", "0.1"]
        assert record["main"] == "__main__"
    assert first[0]["MASTER_PORT"] == first[1]["MASTER_PORT"]

    # An edited script, run again: fresh processes read it afresh.
    _write_script(script, out, version=2)
    job.run_spmd(timeout=120)
    second = _records(out)
    assert {r["version"] for r in second.values()} == {2}
    assert not {r["pid"] for r in second.values()} & {r["pid"] for r in first.values()}

    # A new session finds the served job where serve() saved it.
    loaded = job_load(".monarch_nb/job_state.pkl")
    assert isinstance(loaded, SPMDJob)
    assert loaded.command == job.command
    _write_script(script, out, version=3)
    loaded.run_spmd(timeout=120)
    assert {r["version"] for r in _records(out).values()} == {3}


def test_a_module_through_python_m_torch_distributed_run_on_the_hosts_of_a_job(
    workdir, monkeypatch
):
    out = workdir / "out"
    package = workdir / "spmd_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _write_script(package / "train.py", out, version=1)
    command = ["python", "-m", "torch.distributed.run", "--nproc_per_node", "3"]
    job = serve(
        [*command, "--master-port", "29517", "-m", "spmd_pkg.train", "x"],
        job=LocalJob(hosts=["workers"]),
    )
    path = [str(workdir), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    job.run_spmd(timeout=120)
    records = _records(out)
    assert sorted(records) == [0, 1, 2]
    assert {r["MASTER_PORT"] for r in records.values()} == {"29517"}
    assert {tuple(r["argv"]) for r in records.values()} == {("x",)}


def test_a_script_that_fails_on_one_rank_fails_the_run_naming_it(workdir):
    script = workdir / "train.py"
    script.write_text("import os, sys\nif os.environ['RANK'] == '1':\n    sys.exit(3)\n")
    job = serve(["torchrun", "--nproc-per-node=2", str(script)])
    with pytest.raises(RemoteError) as failed:
        job.run_spmd(timeout=120)
    text = str(failed.value)
    assert "rank(s) 1" in text or "rank 1" in text, text
    assert "status 3" in text, text


@pytest.mark.parametrize(
    ("appdef", "kwargs", "named"),
    [
        (["torchrun", "--nnodes=2", "--nproc-per-node=2", "t.py"], {}, "--nnodes=2"),
        (["bash", "t.py"], {}, "'bash'"),
        (["torchrun", "--no-python", "t.py"], {}, "--no-python"),
        (["torchrun", "--nproc-per-node=two", "t.py"], {}, "--nproc-per-node='two'"),
        (["torchrun", "--nproc-per-node=2", "t.py"], {"scheduler": "mast_conda"}, "mast_conda"),
        (
            SimpleNamespace(
                roles=[SimpleNamespace(entrypoint="torchrun", args=["t.py"], num_replicas=2)]
            ),
            {"scheduler": "local_cwd"},
            "2 nodes",
        ),
        (
            ["torchrun", "t.py"],
            {"scheduler": "slurm", "scheduler_cfg": {"qos": "high"}},
            "['qos']",
        ),
        ("torchrun t.py", {}, "serve(str)"),
    ],
)
def test_bad_commands_are_refused_before_anything_starts(workdir, appdef, kwargs, named):
    with pytest.raises(MeshUsageError) as refused:
        serve(appdef, **kwargs)
    assert named in str(refused.value)
    assert not (workdir / ".monarch_nb").exists()
