"""Monarch's exec_command: one command on the hosts of a host mesh, its output
streamed back labelled by rank (or kept in files on each host), the worst exit
status as the answer, and no process left once it returns (conftest checks)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from monarch_nb import MeshUsageError, this_host
from monarch_nb.job import exec_command

_STREAMED = textwrap.dedent(
    """
    from monarch_nb import this_host
    from monarch_nb.job import exec_command
    status = exec_command(
        this_host(),
        ["python", "-c", "import os; print('hello', os.environ['GREETING'], os.getcwd())"],
        env={{"GREETING": "world"}},
        workdir={workdir!r},
        per_host={{"procs": 2}},
    ).get()
    print("status", status)
    """
)


def test_the_output_streams_back_by_rank_with_env_and_workdir(tmp_path):
    code = _STREAMED.format(workdir=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    lines = out.stdout.splitlines()
    assert sorted(line for line in lines if "hello" in line) == [
        f"[0] hello world {tmp_path}",
        f"[1] hello world {tmp_path}",
    ], out.stdout + out.stderr
    assert lines[-1] == "status 0"


def test_the_answer_is_the_worst_status_and_files_keep_the_output(tmp_path):
    hosts = this_host()
    assert exec_command(hosts, ["sh", "-c", "exit 3"]).get(timeout=60) == 3
    # A command ended by a signal counts as a shell reports it, worse than any exit.
    assert exec_command(hosts, ["sh", "-c", "kill -9 $$"], rank=0).get(timeout=60) == 137
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n")
    status = exec_command(hosts, [str(script)], output_dir=str(tmp_path / "out"), point={})
    assert status.get(timeout=60) == 0
    assert (tmp_path / "out" / "stdout.txt").read_text() == "to stdout\n"
    assert (tmp_path / "out" / "stderr.txt").read_text() == "to stderr\n"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"cmd": "echo hi"}, "cmd='echo hi'"),
        ({"cmd": []}, "cmd=[]"),
        ({"cmd": ["echo"], "rank": 0, "point": {"hosts": 0}}, "give one of them"),
    ],
)
def test_bad_arguments_are_named(kwargs, named):
    with pytest.raises(MeshUsageError, match=named.replace("[", r"\[").replace("]", r"\]")):
        exec_command(this_host(), **kwargs)
