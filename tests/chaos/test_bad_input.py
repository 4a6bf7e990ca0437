"""Bad values through the API: what cannot be pickled or unpickled on either side,
pathologically deep data, gigantic arguments, and timeouts, times, indices and
names that are not ones. Each gives a clear error or succeeds; none hangs, loses
a reply or breaks the mesh."""

from __future__ import annotations

import math

import pytest
from chaos_actors import Probe, UnpicklableThere

from monarch_nb import MeshUsageError, SerializationError, this_host
from monarch_nb._model._future import completed


@pytest.fixture(scope="module")
def procs():
    procs = this_host().spawn_procs(per_host={"procs": 2}, name="bad-input", echo_output=False)
    yield procs
    procs.stop()


@pytest.fixture(scope="module")
def probe(procs):
    return procs.spawn("probe", Probe)


def still_answers(probe) -> None:
    assert probe.rank.call().get(timeout=10).values() == [0, 1]


def test_an_argument_that_cannot_be_unpickled_on_the_ranks(probe):
    with pytest.raises(
        SerializationError,
        match=r"Probe.echo on rank\(s\) 0-1: the arguments could not be unpickled: "
        r"RuntimeError: refusing to unpickle",
    ):
        probe.echo.call(UnpicklableThere()).get(timeout=10)
    still_answers(probe)


def test_a_return_value_that_cannot_be_unpickled_here(probe):
    with pytest.raises(
        SerializationError,
        match=r"Probe.bad_return on rank\(s\) 0-1: the return value could not be unpickled "
        r"on the controller",
    ):
        probe.bad_return.call().get(timeout=10)
    still_answers(probe)


def test_data_too_deep_to_pickle_is_refused_before_sending(probe):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(
        SerializationError, match=r"argument 0 of Probe.echo \(list\) cannot be pickled"
    ):
        probe.echo.call(deep).get(timeout=10)
    still_answers(probe)


@pytest.mark.slow
def test_a_one_gib_argument_arrives_or_fails_clearly_never_hangs(probe):
    big = bytes(1 << 30)
    assert probe.slice(procs=0).length.call_one(big).get(timeout=90) == 1 << 30
    del big
    still_answers(probe)


BAD_TIMEOUT = (
    r"a timeout is a number of seconds >= 0, or None \(or math.inf\) to wait without limit"
)


@pytest.mark.parametrize(
    ("timeout", "shown"),
    [(math.nan, "nan"), (-1, "-1"), ("5", "'5'"), (True, "True"), ([5], r"\[5\]")],
)
def test_a_bad_timeout_is_refused_before_waiting_and_the_reply_is_kept(probe, timeout, shown):
    future = probe.sleep.call(0.5)
    with pytest.raises(MeshUsageError, match=rf"^get\(timeout={shown}\): {BAD_TIMEOUT}$"):
        future.get(timeout=timeout)
    assert not future.done()  # refused at once, not after the call finished
    assert future.get(timeout=10).values() == [0, 1]
    with pytest.raises(MeshUsageError, match=rf"^get\(timeout={shown}\): "):
        future.get(timeout=timeout)  # refused once it is done too; the value stays
    assert future.get(timeout=0).values() == [0, 1]


@pytest.mark.parametrize("timeout", [math.nan, -0.5, "5"])
def test_every_future_checks_its_timeout(timeout):
    done = completed(7)
    for wait in (done.get, done.result, done.exception):
        with pytest.raises(MeshUsageError, match=BAD_TIMEOUT):
            wait(timeout=timeout)
    assert done.get(timeout=0) == 7


def test_an_infinite_timeout_waits_without_limit_as_none_does(probe):
    assert probe.echo.call(3).get(timeout=math.inf).values() == [3, 3]
    assert probe.echo.call(4).get(timeout=10**400).values() == [4, 4]  # beyond a float
    assert completed(5).get(timeout=math.inf) == 5


def test_run_refuses_a_bad_timeout_before_the_cell_is_sent(procs):
    with pytest.raises(MeshUsageError, match=rf"^run\(timeout=nan\): {BAD_TIMEOUT}$"):
        procs.run("sent_by_mistake = True", timeout=math.nan)
    assert procs.run("'sent_by_mistake' in globals()", timeout=30).values() == [False, False]
    assert procs.run("1 + 1", timeout=math.inf).values() == [2, 2]


def test_waits_that_must_end_want_a_finite_timeout(procs):
    with pytest.raises(
        MeshUsageError, match=r"^stacks\(timeout=inf\): give a finite number of seconds >= 0"
    ):
        procs.stacks(timeout=math.inf)
    with pytest.raises(MeshUsageError, match=r"^diagnose\(timeout=nan\): give a finite number"):
        procs.diagnose(timeout=math.nan)
    with pytest.raises(MeshUsageError, match=r"^sync_workspace\(timeout=None\): give a finite"):
        this_host().sync_workspace(timeout=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("since", "shown"), [(math.nan, "nan"), (math.inf, "inf"), (-5, "-5")])
def test_logs_refuse_a_since_that_is_not_a_time(procs, since, shown):
    with pytest.raises(
        MeshUsageError,
        match=rf"^since={shown} is not a time: give seconds ago as a finite number >= 0",
    ):
        procs.logs(since=since)


def test_logs_since_longer_ago_than_datetime_goes_means_every_line(procs):
    procs.run("print('a line to find')", timeout=30)
    for since in (1e30, 10**400, "99999999999d"):
        lines = procs.logs(since=since, grep="a line to find")
        assert {line.rank for line in lines} == {0, 1}


def test_a_negative_index_counts_from_the_end_as_in_python(probe):
    last = probe.slice(procs=-1)
    assert repr(last) == "<ActorMesh 'probe' Probe {rank 1}>"  # one point, not empty
    assert last.rank.call_one().get(timeout=10) == 1
    assert probe.slice(procs=[-1, 0]).rank.call().get(timeout=10).values() == [1, 0]
    with pytest.raises(MeshUsageError, match=r"^index procs=-3 is out of range for size 2$"):
        probe.slice(procs=-3)
    with pytest.raises(MeshUsageError, match=r"^slicing procs=slice\(5, None, None\) selects no"):
        probe.slice(procs=slice(5, None))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", r"^spawn\('', \.\.\.\): an actor's name is a non-empty string, e\.g\. spawn"),
        (123, r"^spawn\(123, \.\.\.\): an actor's name is a non-empty string"),
        (None, r"^spawn\(None, \.\.\.\): an actor's name is a non-empty string"),
        ("a/b", r"^spawn\('a/b', \.\.\.\): an actor's name labels its log lines .* '/'"),
        ("x\n[1] forged", r"may not contain '\\n\[\]' \(control characters"),
        ("\x1b[31mred", r"may not contain '\\x1b\['"),
        (
            "n" * 201,
            r"^spawn\('nnnnnnnnnnnnnnnnnnnn'\.\.\., \.\.\.\): an actor's name is at most 200",
        ),
    ],
)
def test_an_actor_name_must_be_a_label(procs, name, message):
    with pytest.raises(MeshUsageError, match=message):
        procs.spawn(name, Probe)


def test_a_name_with_spaces_dots_and_dashes_is_fine(procs):
    actors = procs.spawn("probe two.b-c_d", Probe)
    assert actors.rank.call().get(timeout=10).values() == [0, 1]
