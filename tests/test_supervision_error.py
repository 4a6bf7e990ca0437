"""SupervisionError: a call to an actor that has failed, as in Monarch.

An endpoint that raises an ``Exception`` fails its call only (``RemoteError``,
Monarch's ``ActorError``): the actor lives on. One that raises a
``BaseException`` that is not an ``Exception`` (``SystemExit``, a class of
one's own), or anything out of an ``explicit_response_port`` endpoint, ends
its actor on that rank: the call raises ``SupervisionError``, so does every
later call that includes that rank, the actor's ``__cleanup__`` gets the
exception, and its owner hears of it once (``__supervise__``, else
``unhandled_fault_hook``). A process that dies under an endpoint call fails
the call with ``SupervisionError`` too. Real workers throughout.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Iterator

import pytest
from fault_hooks import Faults, recording_faults
from polling import wait_until

import monarch_nb
import monarch_nb.actor
from monarch_nb import (
    Actor,
    MeshFailure,
    RemoteError,
    SupervisionError,
    context,
    endpoint,
    this_host,
)

pytestmark = pytest.mark.timeout(120)

T = 60  # seconds: a deadline for any one reply


class Ended(BaseException):
    """Not an Exception: raised out of an endpoint, it ends the actor."""


class Doomed(Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def ok(self) -> int:
        return os.getpid()

    @endpoint
    def raises(self) -> None:
        raise ValueError("an ordinary error")

    @endpoint
    def end(self) -> None:
        raise Ended("the end")

    @endpoint
    def abort(self, reason: str | None) -> None:
        context().actor_instance.abort(reason)

    @endpoint(explicit_response_port=True)
    def forgets_its_port(self, port) -> None:
        raise KeyError("never answered through the port")

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(f"{self.path}.{os.getpid()}", "w") as f:
            f.write(repr(exc))


class AsyncDoomed(Actor):
    @endpoint
    async def ok(self) -> str:
        return "ok"

    @endpoint
    async def exits(self) -> None:
        await asyncio.sleep(0)
        raise SystemExit(3)


class Owner(Actor):
    """Spawns ``Doomed`` on a process mesh it was handed; calls it from here."""

    def __init__(self, procs, path: str) -> None:
        self.child = procs.slice(procs=1).spawn("child", Doomed, path)
        self.seen: list[str] = []

    @endpoint
    def end_child(self) -> list[str]:
        errors = []
        for _ in range(2):  # the call that ends it, and one after
            try:
                self.child.end.call_one().get(timeout=T)
            except SupervisionError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        return errors

    @endpoint
    def supervised(self) -> list[str]:
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure.report())
        return True


@pytest.fixture
def faults() -> Iterator[Faults]:
    with recording_faults() as recorder:
        yield recorder


@pytest.fixture(scope="module")
def procs() -> Iterator:
    """Two processes; the tests end actors, never these processes."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop().get(timeout=T)


def test_supervision_error_is_monarchs_and_a_mesh_failure() -> None:
    assert monarch_nb.actor.SupervisionError is SupervisionError
    assert "SupervisionError" in monarch_nb.actor.__all__
    assert "SupervisionError" in monarch_nb.__all__
    assert issubclass(SupervisionError, MeshFailure)
    assert issubclass(SupervisionError, RuntimeError)
    assert not issubclass(SupervisionError, RemoteError)


def test_a_base_exception_ends_its_actor_and_the_hook_hears_once(procs, faults, tmp_path):
    path = str(tmp_path / "cleanup")
    doomed = procs.spawn("doomed", Doomed, path)
    pids = [pid for _, pid in doomed.ok.call().get(timeout=T)]

    # An Exception fails the call only: the actor lives on, nobody is told.
    with pytest.raises(RemoteError, match="ValueError: an ordinary error") as ordinary:
        doomed.raises.call().get(timeout=T)
    assert not isinstance(ordinary.value, SupervisionError)

    with pytest.raises(SupervisionError) as ended:
        doomed.slice(procs=1).end.call_one().get(timeout=T)
    text = str(ended.value)
    assert text.startswith("Endpoint call Doomed.end() failed, The actor ")
    assert "test_supervision_error.Doomed doomed{'procs': 1/2} and all its descendants" in text
    assert "Doomed.end raised Ended: the end on rank 1" in text
    assert "spawn the actor mesh 'doomed' again" in text
    assert ended.value.ranks == (1,)
    assert ended.value.endpoint == "Doomed.end"

    assert faults.called.wait(T), "the actor's failure never reached unhandled_fault_hook"
    # Later calls that include rank 1 fail the same way; rank 0's actor lives on.
    with pytest.raises(SupervisionError, match=r"Doomed\.ok\(\) failed, The actor .* failed"):
        doomed.ok.call().get(timeout=T)
    with pytest.raises(SupervisionError, match="Ended: the end"):
        doomed.slice(procs=1).ok.call_one().get(timeout=T)
    assert doomed.slice(procs=0).ok.call_one().get(timeout=T) == pids[0]
    assert len(faults.failures) == 1, [str(f) for f in faults.failures]
    (failure,) = faults.failures
    assert type(failure) is MeshFailure
    assert failure.ranks == (1,)
    assert "(MeshFailure(mesh_name=doomed, crashed_ranks=[1]))" in str(failure)
    assert failure.report().startswith("The actor test_supervision_error.Doomed doomed")

    # It stopped as a stop stops it: its __cleanup__ got the exception.
    wait_until(lambda: os.path.exists(f"{path}.{pids[1]}"), T, "the ended actor's __cleanup__")
    with open(f"{path}.{pids[1]}") as f:
        assert f.read() == "Ended('the end')"
    doomed.stop().get(timeout=T)


def test_system_exit_out_of_an_async_endpoint_ends_only_its_actor(procs, faults):
    doomed = procs.slice(procs=0).spawn("async_doomed", AsyncDoomed)
    neighbour = procs.slice(procs=0).spawn("neighbour", AsyncDoomed)
    with pytest.raises(SupervisionError, match=r"AsyncDoomed\.exits raised SystemExit: 3"):
        doomed.exits.call_one().get(timeout=T)
    assert faults.called.wait(T)
    assert neighbour.ok.call_one().get(timeout=T) == "ok"  # same process, another actor
    with pytest.raises(SupervisionError):
        doomed.ok.call_one().get(timeout=T)
    neighbour.stop().get(timeout=T)


def test_an_explicit_response_port_endpoint_that_raises_ends_its_actor(procs, faults, tmp_path):
    doomed = procs.slice(procs=1).spawn("forgetful", Doomed, str(tmp_path / "c"))
    with pytest.raises(SupervisionError, match="out of an explicit_response_port endpoint"):
        doomed.forgets_its_port.call_one().get(timeout=T)
    assert faults.called.wait(T)


@pytest.mark.parametrize("reason", [None, "out of patience"])
def test_abort_ends_the_actor_naming_its_reason(procs, faults, tmp_path, reason):
    doomed = procs.slice(procs=0).spawn("aborts", Doomed, str(tmp_path / "c"))
    words = reason or "no reason provided"
    with pytest.raises(SupervisionError, match=f"ActorAborted: {words} on rank 0, by context"):
        doomed.abort.call_one(reason).get(timeout=T)
    assert faults.called.wait(T)
    assert words in faults.failures[0].report()


def test_an_owner_hears_once_and_its_own_calls_raise_supervision_error(procs, faults, tmp_path):
    owner = procs.slice(procs=0).spawn("owner", Owner, procs, str(tmp_path / "c"))
    errors = owner.end_child.call_one().get(timeout=T)
    assert len(errors) == 2, errors
    assert errors[0].startswith("SupervisionError: Endpoint call Doomed.end() failed, The actor")
    assert "Doomed.end raised Ended: the end on rank 1" in errors[1]

    seen = wait_until(lambda: owner.supervised.call_one().get(timeout=T), T, "__supervise__")
    assert len(seen) == 1, seen
    assert re.match(r"The actor test_supervision_error\.Doomed child\S* and all its", seen[0])
    assert "Doomed.end raised Ended on rank 1, which ended its actor there" in seen[0]
    assert not faults.failures  # its owner handled it
    owner.stop().get(timeout=T)


def test_a_process_that_dies_under_a_call_fails_it_with_supervision_error(faults):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        doomed = procs.spawn("doomed", Doomed, "unused")
        (pid,) = [pid for _, pid in doomed.ok.call().get(timeout=T)]
        os.kill(pid, signal.SIGKILL)
        # Refused at once, or sent before the death was seen and failed when it is.
        with pytest.raises(
            SupervisionError, match=r"Endpoint call Doomed\.ok\(\) failed, "
        ) as info:
            doomed.ok.call().get(timeout=T)
        text = str(info.value)
        assert (
            "failed, The actor test_supervision_error.Doomed doomed{'procs': 0/1} and all its "
            "descendants have failed: rank 0 (pid" in text
        )
        assert "killed by signal SIGKILL" in text
        assert isinstance(info.value, MeshFailure)
        assert info.value.ranks == (0,)
    finally:
        procs.stop().get(timeout=T)
