"""The front door's promises: the first script prints what it says, and the demo runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def first_example() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## A first script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_first_example_runs_as_a_script(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(first_example())
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "ValueMesh({procs: 4}) {0-3: 0.3" in out.stdout
    assert re.search(r"^\[2\] rank 2 got 2 samples$", out.stdout, re.M)


@pytest.mark.slow
def test_the_demo_runs_headless():
    out = subprocess.run(
        [sys.executable, "-m", "monarch_nb", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warning, from any rank
    assert "slice(procs=1).square.call_one(7) = 49" in out.stdout  # values come labelled
    assert "{'procs': 3} -> shape (1024, 1024), sum 10485760" in out.stdout  # a tensor round trip
    assert "all_reduce of [rank, rank] = ValueMesh({procs: 4}) {0-3: [6.0, 6.0]}" in out.stdout
    assert "was killed by signal SIGKILL" in out.stdout
    assert "square.call(2) after restart() = ValueMesh({procs: 4}) {0-3: 4}" in out.stdout
    assert "stopped: <ProcMesh 'demo' {procs: 4} stopped>" in out.stdout
    unlabelled = [line for line in out.stdout.splitlines() if re.fullmatch(r"[\d{}:\-, ]+", line)]
    assert not unlabelled, f"the demo printed values without saying what they are: {unlabelled}"


def test_the_configuration_table_is_every_setting():
    from monarch_nb.config import table

    text = (ROOT / "docs" / "clusters.md").read_text()
    assert table() in text
