"""What a failed call does to the rank's torch.distributed group (worker
_collective_abort): only a broken gloo transport ends it; anything else,
even an exception that cannot say what it is, fails its call alone.

The release itself (survivors two hops from a dead rank freed at once) is
tests/test_recovery.py::test_a_rank_killed_inside_a_gloo_all_reduce_frees_the_survivors.
"""

from __future__ import annotations

import pytest

ODD = (
    "import torch.distributed\n"  # past the check that torch.distributed is in use
    "class Odd(Exception):\n"
    "    def __str__(self):\n"
    "        raise RuntimeError('no words')\n"
    "raise Odd()\n"
)


def test_an_exception_that_cannot_say_what_it_is_fails_only_its_call(procs2):
    pytest.importorskip("torch")
    with pytest.raises(Exception, match=r"str\(\) of the exception failed") as failed:
        procs2.run(ODD)
    assert "Odd" in str(failed.value)
    assert procs2.run("rank").values() == [0, 1]  # the ranks answer on


def test_a_gloo_group_survives_an_ordinary_failure(procs2):
    pytest.importorskip("torch")
    from monarch_nb._services._dist import fresh_store_path

    procs2.run(
        "import os, torch, torch.distributed as dist\n"
        f"os.environ['MONARCH_NB_DIST_FILE'] = {fresh_store_path()!r}\n"
        "os.environ['RANK'], os.environ['WORLD_SIZE'] = str(rank), '2'\n"
        "from monarch_nb._services._dist import init_process_group\n"
        "init_process_group('gloo')\n"
    )
    # The words of a broken gloo pair, but not from gloo's transport: the group stays.
    with pytest.raises(Exception, match="not from gloo"):
        procs2.run("raise RuntimeError('Connection closed by peer, not from gloo')")
    code = "x = torch.ones(1)\ndist.all_reduce(x)\nint(x)"
    assert procs2.run(code).values() == [2, 2]
