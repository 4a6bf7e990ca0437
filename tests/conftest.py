"""Shared fixtures: real meshes, and a guard that no test leaves a worker behind."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from process_checks import leaked_since, our_workers

if TYPE_CHECKING:
    from kernel_utils import Kernel


def _fail_on_leaks(before: set[int], what: str) -> None:
    leaked = leaked_since(before)
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


@pytest.fixture(scope="module")
def kernel_session() -> Iterator[Kernel]:
    """A real IPython kernel with ``%load_ext monarch_nb`` run, shared by the
    tests of one module (each module that asks gets its own)."""
    from kernel_utils import Kernel  # jupyter_client: only for the modules that ask

    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        yield k


@pytest.fixture
def pair() -> Iterator:
    """A ROUTER and a DEALER connected over TCP loopback (plain pyzmq sockets)."""
    import zmq

    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, dealer
    router.close(0)
    dealer.close(0)


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

# Rank log files (docs/logs.md) of this test run go to a private directory of
# its own, not the user's ~/.monarch_nb/logs; every process started inherits it.
if "MONARCH_NB_LOG_DIR" not in os.environ:
    os.environ["MONARCH_NB_LOG_DIR"] = tempfile.mkdtemp(prefix="monarch_nb_logs_")
    atexit.register(shutil.rmtree, os.environ["MONARCH_NB_LOG_DIR"], True)
