"""controller/_diagnose: which ranks wait in which collective, and where the others are."""

from __future__ import annotations

import time

import pytest

from monarch_nb import MeshFailure, this_host
from monarch_nb._controller._diagnose import Diagnosis, classify, parse_python_stack

pytestmark = pytest.mark.timeout(240)

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed"
IN_ALL_REDUCE = f"""\
  File "/repo/monarch_nb/_worker/_namespace.py", line 54, in execute
    exec(body, self.globals)
  File "train.py", line 40, in step
    dist.all_reduce(grad)
  File "{TORCH}/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
  File "{TORCH}/distributed_c10d.py", line 3252, in all_reduce
    work.wait()
"""
IN_BACKWARD = """\
  File "/repo/monarch_nb/_worker/_namespace.py", line 54, in execute
    exec(body, self.globals)
  File "train.py", line 88, in step
    loss.backward()
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 600, in backward
    torch.autograd.backward(
"""


def test_a_rank_in_a_collective_is_placed_at_its_call_site():
    place = classify(0, parse_python_stack(IN_ALL_REDUCE), "Trainer.step", 12.0)
    assert place.collective == "all_reduce"
    assert str(place.frame) == "`dist.all_reduce(grad)` at train.py:40 in step"
    other = classify(7, parse_python_stack(IN_BACKWARD), "Trainer.step", 12.0)
    assert other.collective is None
    assert str(other.frame) == "`loss.backward()` at train.py:88 in step"


def test_the_report_names_the_rank_that_never_entered():
    places = tuple(
        classify(r, parse_python_stack(IN_BACKWARD if r == 7 else IN_ALL_REDUCE), "step", 9.0)
        for r in range(8)
    )
    report = Diagnosis("m", places, "stacks")
    assert report.collectives() == {"all_reduce": (0, 1, 2, 3, 4, 5, 6)}
    assert report.missing() == (7,)
    text = str(report)
    assert "ranks 0-6 waiting in all_reduce, called from `dist.all_reduce(grad)` at train" in text
    assert "rank 7 not in it: in `loss.backward()` at train.py:88 in step" in text
    assert "rank 7 never entered all_reduce" in text


def test_gloo_all_reduce_that_one_rank_never_joins():
    procs = this_host().spawn_procs(per_host={"procs": 3}, echo_output=False)
    try:
        procs.run(
            "import torch, torch.distributed as dist\ndist.init_process_group('gloo')", timeout=120
        )
        procs.exec(
            "def never_joins():\n"
            "    time.sleep(600)\n"
            "import time\n"
            "x = torch.ones(2)\n"
            "if rank == 1:\n"
            "    never_joins()\n"
            "else:\n"
            "    dist.all_reduce(x)\n"
        )
        deadline = time.monotonic() + 60
        while True:
            report = procs.diagnose(timeout=10)
            places = {p.rank: p for p in report.places}
            # Rank 1 may be caught on its way in (a loaded machine starts its cell
            # late): wait until it sleeps where the hang is.
            rank_1 = places[1].frame
            if (
                report.collectives() == {"all_reduce #1": (0, 2)}
                and rank_1 is not None
                and rank_1.function == "never_joins"
            ):
                break
            assert time.monotonic() < deadline, f"never saw the hang:\n{report}"
        assert report.missing() == (1,)
        text = str(report)
        # numbered by gloo's sequence number: the group's first collective
        assert "ranks 0,2 waiting in all_reduce #1, called from `dist.all_reduce(x)` at" in text
        assert "0 collective(s) issued" in text  # rank 1
        assert "rank 1 not in it: in `time.sleep(600)` at <mesh-cell-" in text
        assert ":2 in never_joins" in text
        assert "rank 1 never entered all_reduce #1" in text
        assert "Python stack" in text  # says what it was read from
    finally:
        procs.stop()


def test_a_timed_out_cell_stuck_in_a_collective_says_where_the_ranks_were():
    procs = this_host().spawn_procs(per_host={"procs": 3}, echo_output=False)
    try:
        procs.run(
            "import torch, torch.distributed as dist\ndist.init_process_group('gloo')",
            timeout=120,
        )
        source = (
            "import time\n"
            "x = torch.ones(2)\n"
            "if rank == 1:\n"
            "    time.sleep(600)\n"
            "dist.all_reduce(x)\n"
        )
        with pytest.raises(MeshFailure, match=r"rank\(s\) 0,2 did not stop") as info:
            procs.run(source, timeout=10)
        text = str(info.value)
        assert "where the ranks were before the kill:" in text
        assert "ranks 0,2 waiting in all_reduce" in text
        assert "rank 1 never entered all_reduce" in text
    finally:
        procs.stop()


def test_a_rank_stuck_in_c_holding_the_gil_is_read_with_py_spy():
    from monarch_nb._services import _py_spy

    if _py_spy.find() is None:
        pytest.skip("py-spy is not installed here")
    procs = this_host().spawn_procs(per_host={"procs": 2}, echo_output=False)
    try:
        procs.slice(procs=1).exec(
            "import re\n"
            "def spin_in_c():\n"
            "    re.match(r'(a*)*b', 'a' * 64)  # backtracking in _sre, GIL held\n"
            "spin_in_c()\n"
        )
        deadline = time.monotonic() + 60
        while True:
            report = procs.diagnose(timeout=1)
            place = report.places[1]
            if "could not read it" in place.note:
                pytest.skip(f"py-spy cannot attach here: {place.note}")
            if place.stuck and place.frame is not None and place.frame.function == "spin_in_c":
                break
            assert time.monotonic() < deadline, f"rank 1 never seen in spin_in_c:\n{report}"
        text = str(report)
        assert "rank 1 in <mesh-cell-" in text
        assert "in spin_in_c, stuck in C holding the GIL (read with py-spy)" in text
        assert "py-spy for ranks that could not answer" in text
        assert "rank 0 idle" in text
    finally:
        procs.stop()
