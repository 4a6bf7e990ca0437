"""controller/_stacks and common/_py_spy: Python and native stacks grouped by rank set,
profiles, and what is said when py-spy cannot run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monarch_nb import ProfilerUnavailable, Stacks, this_host
from monarch_nb._controller._stacks import normalize_py_spy
from monarch_nb._services import _py_spy

pytestmark = pytest.mark.timeout(180)

SPIN_IN_C = """
import re

def spin_in_c():
    re.match(r"(a*)*b", "a" * 64)  # catastrophic backtracking, all in _sre, GIL held

spin_in_c()
"""


def _py_spy_attaches() -> str | None:
    """Why py-spy cannot read a child of ours here, or None if it can."""
    try:
        _py_spy.executable()
    except ProfilerUnavailable as exc:
        return str(exc)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while True:  # until the interpreter is up enough for py-spy to find it
            try:
                _py_spy.dump(child.pid, 0, native=False)
                return None
            except ProfilerUnavailable as exc:
                return str(exc)
            except _py_spy.PySpyFailed as exc:
                if time.monotonic() > deadline:
                    return str(exc)
                time.sleep(0.2)
    finally:
        child.kill()
        child.wait()


@pytest.fixture(scope="module")
def py_spy_here() -> None:
    why = _py_spy_attaches()
    if why is not None:
        pytest.skip(f"py-spy cannot attach to processes here: {why}")


# -- grouping (no processes) ---------------------------------------------------------

DUMP = """Process {pid}: /usr/bin/python -m monarch_nb.worker
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} ({status}): "MainThread"
    sre_ucs1_match (libpython3.11.so.1.0)
    spin_in_c (<mesh-cell-1>:5)
    0x{address} (libc.so.6)
Thread {tid} (idle): "monarch_nb-wire"
    poll (libc.so.6)
"""


def test_native_dumps_of_identical_processes_group_as_one():
    raw = {
        0: DUMP.format(pid=101, tid=105, status="active+gil", address="7fef96e4524a"),
        1: DUMP.format(pid=202, tid=206, status="active", address="7f00aa00524a"),
        2: DUMP.format(pid=303, tid=307, status="idle", address="7f1234e4524a").replace(
            "spin_in_c", "elsewhere"
        ),
    }
    stacks = Stacks({r: normalize_py_spy(text) for r, text in raw.items()}, native=True)
    assert stacks[0].startswith('Thread "MainThread" (active+gil)\n')
    assert "Process" not in stacks[0]
    assert "Python v" not in stacks[0]
    groups = stacks.groups()
    assert [ranks for ranks, _ in groups] == [(0, 1), (2,)]
    text = str(stacks)
    assert "3 rank(s), 2 distinct" in text
    assert "── ranks 0-1 ──" in text
    assert "── rank 2 ──" in text
    assert text.count("spin_in_c") == 1


def test_python_stacks_stay_a_dict_and_fold_when_printed():
    stacks = Stacks({r: '  File "a.py", line 3, in f\n' for r in range(8)} | {8: "<no stack>"})
    assert stacks[3] == '  File "a.py", line 3, in f\n'
    assert isinstance(stacks, dict)
    assert "── ranks 0-7 ──" in str(stacks)
    assert "── rank 8 ──\n<no stack>" in str(stacks)


# -- what is said when py-spy cannot run ------------------------------------------------


def test_missing_py_spy_says_how_to_install_it(monkeypatch):
    monkeypatch.delenv("MONARCH_NB_PY_SPY", raising=False)
    monkeypatch.setattr(_py_spy.shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(ProfilerUnavailable, match=r"not installed here: pip install py-spy"):
        _py_spy.executable()


def test_refused_ptrace_says_what_to_do(tmp_path: Path, monkeypatch):
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated "
        "permissions' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("MONARCH_NB_PY_SPY", str(fake))
    with pytest.raises(ProfilerUnavailable, match=r"OS refused to let py-spy attach") as info:
        _py_spy.dump(os.getpid(), 3)
    assert "kernel.yama.ptrace_scope=0" in str(info.value)
    assert "CAP_SYS_PTRACE" in str(info.value)
    assert info.value.ranks == (3,)


def test_py_spy_missing_on_another_host_names_that_host():
    outcome = _py_spy.Outcome(_py_spy.NOT_INSTALLED, "", "py-spy is not installed")
    with pytest.raises(ProfilerUnavailable, match=r"not installed on host node2 \(") as info:
        _py_spy.check(outcome, rank=5, pid=1234, host="node2")
    assert info.value.ranks == (5,)


# -- real ranks ---------------------------------------------------------------------------


def _main_thread(stack: str) -> list[str]:
    lines = stack.split('Thread "MainThread"', 1)[1].splitlines()[1:]
    return [line.strip() for line in lines if line.startswith("    ")]


def test_native_stacks_show_a_rank_spinning_in_c(py_spy_here):
    procs = this_host().spawn_procs(per_host={"procs": 2}, echo_output=False)
    try:
        procs.slice(procs=1).exec(SPIN_IN_C)
        deadline = time.monotonic() + 60
        while True:
            stacks = procs.stacks(native=True)
            if "spin_in_c" in stacks[1]:
                break
            assert time.monotonic() < deadline, f"rank 1 never reached spin_in_c:\n{stacks}"
        frames = _main_thread(stacks[1])
        at = next(i for i, f in enumerate(frames) if f.startswith("match (re/__init__.py:"))
        assert frames[at + 1].startswith("spin_in_c (<mesh-cell-")
        assert at > 0
        assert not re.search(r"\.py:\d+\)$", frames[at - 1])  # a C frame inside it
        assert "spin_in_c" not in stacks[0]
        assert "── rank 1 ──" in str(stacks)
        # The rank's own wire thread cannot answer while C holds its GIL:
        python = procs.stacks(timeout=1)
        assert python[1].startswith("<no stack: no answer within 1 s")
        assert "stacks(native=True)" in python[1]

        profile = procs.profile(1)
        assert profile.files[1].lstrip().startswith(b"<?xml")
        assert b"spin_in_c" in profile.files[1]
        assert 'alt="rank 1 flame graph"' in profile._repr_html_()
    finally:
        procs.stop()


def test_python_stacks_of_ranks_in_the_same_place_are_shown_once(procs4):
    running = procs4.exec("import time\ndef nap():\n    time.sleep(600)\nnap()")
    try:
        deadline = time.monotonic() + 60
        while True:
            stacks = procs4.stacks(timeout=10)
            if all("time.sleep(600)" in s for s in stacks.values()):
                break
            assert time.monotonic() < deadline, f"the ranks never reached nap():\n{stacks}"
        assert [ranks for ranks, _ in stacks.groups()] == [(0, 1, 2, 3)]
        assert str(stacks).count("time.sleep(600)") == 1
        assert "── ranks 0-3 ──" in str(stacks)
    finally:
        with pytest.raises(KeyboardInterrupt, match="interrupted on rank"):
            running.interrupt(grace=30)
