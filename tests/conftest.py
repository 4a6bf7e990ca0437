"""Shared fixtures: real meshes, and a guard that no test leaves a worker behind."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

# Every worker this test session starts (directly, through a kernel, or through
# a subprocess controller) inherits this marker, so the leak check can find
# exactly ours even if they were re-parented.
SESSION_MARK = "MONARCH_NB_TEST_SESSION"
os.environ[SESSION_MARK] = uuid.uuid4().hex
_LEAK_WAIT_S = 6.0


def our_workers() -> dict[int, str]:
    """pid -> command line of every live monarch_nb worker of this test session."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or ())
            if "monarch_nb.worker" not in cmdline:
                continue
            ours = proc.environ().get(SESSION_MARK) == os.environ[SESSION_MARK]
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.info["pid"]] = cmdline
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_for_exit(pids: set[int], timeout: float) -> set[int]:
    """Wait up to ``timeout`` s for ``pids`` to exit; returns those still alive."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and not _is_zombie(p)}
        if alive:
            time.sleep(0.05)
    return alive


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _fail_on_leaks(before: set[int], what: str) -> None:
    leaked = wait_for_exit(set(our_workers()) - before, _LEAK_WAIT_S)
    for pid in leaked:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    if leaked:
        pytest.fail(f"{what} left worker processes behind: {sorted(leaked)}", pytrace=False)


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail any test that leaves a worker it started running."""
    before = set(our_workers())
    yield
    _fail_on_leaks(before, "this test")


@pytest.fixture(autouse=True, scope="module")
def no_leaked_processes_per_module() -> Iterator[None]:
    before = set(our_workers())
    yield
    _fail_on_leaks(before, "this module's fixtures")


@pytest.fixture(scope="module")
def procs4() -> Iterator:
    """A 4-process mesh shared by the tests of one module (must stay healthy)."""
    from monarch_nb import this_host

    procs = this_host().spawn_procs(per_host={"procs": 4})
    yield procs
    procs.stop()


@pytest.fixture
def procs2() -> Iterator:
    """A fresh 2-process mesh for tests that break it."""
    from monarch_nb import this_host

    procs = this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop()


# Workers import the actor classes of test modules by reference, as they would
# import a user's library; classes from __main__ (notebooks) travel by value,
# which tests/test_actor.py covers with a real script.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_TESTS_DIR, os.environ.get("PYTHONPATH", "")) if p
)
