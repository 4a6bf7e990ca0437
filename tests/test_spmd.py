"""monarch_nb.spmd: an unmodified torchrun script on a mesh, and torchrun's environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monarch_nb import Actor, RemoteError, endpoint, this_host
from monarch_nb.spmd import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async

SCRIPT = str(Path(__file__).parent / "spmd_scripts" / "allreduce_script.py")
TORCHRUN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class Env(Actor):
    @endpoint
    def get(self) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in TORCHRUN}


@pytest.fixture(scope="module")
def procs2():
    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        yield procs


def test_main_runs_the_script_with_torchruns_environment(procs2, tmp_path):
    actors = procs2.spawn("_SPMDActor", SPMDActor)
    first = actors.slice(procs=0)
    addr, port = first.get_host_port.call_one(None).get(timeout=30)
    assert isinstance(addr, str)
    assert isinstance(port, int)
    args = [SCRIPT, "--out", str(tmp_path), "--scale", "2"]
    assert actors.main.call("127.0.0.1", port, args).get(timeout=120).values() == [True] * 2
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}.txt").read_text()
        assert text == f"2 [2.0, 2.0] {rank} 0 rank 2"


def test_a_nonzero_exit_status_fails_the_call(procs2, tmp_path):
    actors = procs2.spawn("_SPMDActor", SPMDActor)
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit(3)\n")
    with pytest.raises(RemoteError, match="exited with status 3"):
        actors.main.call("127.0.0.1", 1, [str(script)]).get(timeout=60)
    with pytest.raises(RemoteError, match="no script or module given"):
        actors.main.call("127.0.0.1", 1, []).get(timeout=60)


def test_module_form_runs_as_main(procs2, tmp_path):
    actors = procs2.spawn("_SPMDActor", SPMDActor)
    (tmp_path / "spmd_mod_probe.py").write_text(
        "import os, sys\n"
        "if __name__ == '__main__':\n"
        "    open(sys.argv[1] + os.environ['RANK'], 'w').write(' '.join(sys.argv))\n"
    )
    env = procs2.spawn("path", PathAdder)
    env.add.call(str(tmp_path)).get(timeout=30)
    out = str(tmp_path / "argv")
    actors.main.call("127.0.0.1", 1, ["-m", "spmd_mod_probe", out]).get(timeout=60)
    # As `python -m`: argv[0] is the module's file.
    assert Path(out + "1").read_text() == f"{tmp_path / 'spmd_mod_probe.py'} {out}"


class PathAdder(Actor):
    @endpoint
    def add(self, path: str) -> None:
        import sys

        sys.path.insert(0, path)


def test_setup_torch_elastic_env_keeps_the_launch_master_and_fills_the_rest(procs2):
    env = procs2.spawn("env", Env)
    before = env.get.call().get(timeout=30).values()
    setup_torch_elastic_env(procs2)
    after = env.get.call().get(timeout=30).values()
    for rank, values in enumerate(after):
        assert values["MASTER_ADDR"] == before[0]["MASTER_ADDR"]
        assert values["MASTER_PORT"] == before[0]["MASTER_PORT"]
        assert values["RANK"] == str(rank)
        assert values["GROUP_RANK"] == "0"
        assert values["ROLE_NAME"] == "rank"
        assert values["GROUP_WORLD_SIZE"] == "1"


async def _setup_async(procs, addr, port):
    await setup_torch_elastic_env_async(procs, addr, port)


def test_setup_async_with_a_named_master(procs2):
    import asyncio

    asyncio.run(_setup_async(procs2, "10.0.0.7", 4242))
    env = procs2.spawn("env", Env)
    values = env.get.call().get(timeout=30).values()
    assert {(v["MASTER_ADDR"], v["MASTER_PORT"]) for v in values} == {("10.0.0.7", "4242")}
    with pytest.raises(ValueError, match="both master_addr and master_port"):
        setup_torch_elastic_env(procs2, master_addr="x")
