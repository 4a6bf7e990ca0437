"""%mesh run: an unmodified torchrun-style script on the mesh, through a real kernel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_utils import Kernel

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).parent / "spmd_scripts" / "allreduce_script.py"


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --name m")
        yield k


def test_run_streams_each_ranks_output_and_passes_the_args(kernel, tmp_path):
    reply = kernel.ok(f"%mesh run {SCRIPT} --out {tmp_path} --scale 3", timeout=90)
    out = reply.stream()
    assert "rank 0 of 2: [3.0, 3.0]" in out
    assert "rank 1 of 2: [3.0, 3.0]" in out
    assert (tmp_path / "rank1.txt").read_text() == "2 [3.0, 3.0] 1 0 rank 2"


def test_a_failing_script_is_an_error_naming_its_status(kernel, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("print('about to fail')\nraise SystemExit(4)\n")
    reply = kernel.execute(f"%mesh run --ranks 0 {script}", timeout=60)
    assert "exited with status 4" in reply.traceback


def test_usage_errors(kernel):
    for line, message in (("--mesh", "--mesh needs a value"), ("", "no script given")):
        reply = kernel.execute(f"%mesh run {line}")
        assert reply.content["ename"] == "UsageError"
        assert message in reply.content["evalue"]
