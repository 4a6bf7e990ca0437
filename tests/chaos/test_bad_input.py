"""Bad values through the API: what cannot be pickled or unpickled on either side,
pathologically deep data, and gigantic arguments. Each gives a clear error or
succeeds; none hangs or breaks the mesh."""

from __future__ import annotations

import pytest
from chaos_actors import Probe, UnpicklableThere

from monarch_nb import SerializationError, this_host


@pytest.fixture(scope="module")
def probe():
    procs = this_host().spawn_procs(per_host={"procs": 2}, name="bad-input", echo_output=False)
    yield procs.spawn("probe", Probe)
    procs.stop()


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
