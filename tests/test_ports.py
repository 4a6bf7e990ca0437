"""Ports and channels, explicit response ports, concurrent endpoints and __cleanup__."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest

from monarch_nb import (
    Actor,
    Channel,
    MeshUsageError,
    Port,
    RemoteError,
    concurrent_endpoint,
    context,
    endpoint,
)


class Producer(Actor):
    @endpoint
    def produce(self, port: Port, n: int) -> int:
        rank = context().actor_instance.rank.rank
        for i in range(n):
            port.send((rank, i))
        return n

    @endpoint
    def fail_into(self, port: Port) -> None:
        port.exception(ValueError("bad batch"))


class Consumer(Actor):
    """Owns a channel; other actors send into its port."""

    def __init__(self) -> None:
        self.port, self.receiver = Channel.open()

    @endpoint
    async def port_of(self) -> Port:
        return self.port

    @endpoint
    async def take(self, n: int) -> list:
        return sorted([await self.receiver.recv() for _ in range(n)])


class Answers(Actor):
    @endpoint(explicit_response_port=True)
    def later(self, port, x: int) -> None:
        threading.Timer(0.05, lambda: port.send(2 * x)).start()

    @endpoint(explicit_response_port=True)
    def refuse(self, port, why: str) -> None:
        port.exception(KeyError(why))

    @endpoint(explicit_response_port=True)
    def pass_port_on(self, port) -> str:
        try:
            pickle.dumps(port)
        except MeshUsageError as exc:
            port.send(str(exc))
        return "ignored"


class Gate(Actor):
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.unblock = asyncio.Event()

    @concurrent_endpoint
    async def wait(self) -> str:
        self.ready.set()
        await self.unblock.wait()
        return "done"

    @endpoint
    async def release_when_ready(self) -> str:
        await self.ready.wait()
        self.unblock.set()
        return "released"


class Tidy(Actor):
    def __init__(self, port: Port) -> None:
        self.port = port

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: Exception | None) -> None:
        self.port.send(("cleaned", context().actor_instance.rank.rank, exc))


class Rebinds(Actor):
    @endpoint
    def answer(self, x: int) -> int:
        return x

    @endpoint
    def answer_through_a_port_from_now_on(self) -> None:
        @endpoint(explicit_response_port=True)
        def answer(port: Port, x: int) -> None:
            port.send(-x)

        self.answer = answer  # an instance attribute shadows the method


def test_a_port_passed_to_actors_delivers_to_the_controller(procs4):
    producers = procs4.spawn("producers", Producer)
    port, receiver = Channel.open()
    assert producers.produce.call(port, 3).get(timeout=60).values() == [3, 3, 3, 3]
    got = sorted(receiver.recv().get(timeout=30) for _ in range(12))
    assert got == sorted((r, i) for r in range(4) for i in range(3))
    # Values from one sender arrive in the order sent.
    assert [v for v in got if v[0] == 2] == [(2, 0), (2, 1), (2, 2)]


def test_recv_is_awaitable_and_a_port_can_carry_an_error(procs4):
    producers = procs4.spawn("producers2", Producer)
    port, receiver = Channel.open()
    producers.slice(procs=1).fail_into.call_one(port).get(timeout=60)

    async def receive():
        return await receiver.recv()

    with pytest.raises(ValueError, match="bad batch"):
        asyncio.run(receive())


def test_an_actor_owns_a_channel_that_other_actors_send_into(procs4):
    consumer = procs4.slice(procs=0).spawn("consumer", Consumer)
    producers = procs4.slice(procs=slice(1, 4)).spawn("producers3", Producer)
    port = consumer.port_of.call_one().get(timeout=60)
    producers.produce.call(port, 2).get(timeout=60)
    assert consumer.take.call_one(6).get(timeout=60) == sorted(
        (r, i) for r in (1, 2, 3) for i in range(2)
    )


def test_a_port_receiver_stays_where_it_was_opened():
    _, receiver = Channel.open()
    with pytest.raises(MeshUsageError, match="send its Port instead"):
        pickle.dumps(receiver)
    receiver.close()
    with pytest.raises(MeshUsageError, match="closed"):
        receiver.recv().get(timeout=5)


def test_an_explicit_response_port_answers_from_another_thread(procs4):
    answers = procs4.spawn("answers", Answers)
    assert answers.later.call(21).get(timeout=60).values() == [42] * 4
    with pytest.raises(RemoteError, match="KeyError"):
        answers.slice(procs=2).refuse.call_one("no").get(timeout=60)
    message = answers.slice(procs=0).pass_port_on.call_one().get(timeout=60)
    assert "Channel.open()" in message


def test_an_endpoint_rebound_at_run_time_is_called_as_it_is_now(procs4):
    # A worker looks up an endpoint's marks once per actor: it must look again
    # when the name comes to mean another function.
    rebinds = procs4.slice(procs=0).spawn("rebinds", Rebinds)
    assert rebinds.answer.call_one(5).get(timeout=60) == 5
    rebinds.answer_through_a_port_from_now_on.call_one().get(timeout=60)
    assert rebinds.answer.call_one(5).get(timeout=60) == -5


def test_a_concurrent_endpoint_lets_the_actor_take_the_next_message(procs4):
    gate = procs4.slice(procs=3).spawn("gate", Gate)
    waiting = gate.wait.call_one()
    assert gate.release_when_ready.call_one().get(timeout=60) == "released"
    assert waiting.get(timeout=60) == "done"


def test_cleanup_runs_when_an_actor_mesh_is_stopped(procs4):
    port, receiver = Channel.open()
    tidy = procs4.slice(procs=slice(0, 2)).spawn("tidy", Tidy, port)
    assert tidy.ping.call().get(timeout=60).values() == ["pong", "pong"]
    tidy.stop()
    got = sorted((receiver.recv().get(timeout=30) for _ in range(2)), key=repr)
    assert got == [("cleaned", 0, None), ("cleaned", 1, None)]


def test_many_values_through_one_port_none_lost(procs4):
    producers = procs4.spawn("producers4", Producer)
    port, receiver = Channel.open()
    started = time.monotonic()
    producers.produce.call(port, 500).get(timeout=120)
    got = [receiver.recv().get(timeout=60) for _ in range(2000)]
    assert sorted(got) == sorted((r, i) for r in range(4) for i in range(500))
    assert time.monotonic() - started < 120


def test_send_with_a_port_delivers_each_value_there(procs4):
    from monarch_nb import send

    answers = procs4.spawn("answers_send", Answers)
    port, receiver = Channel.open()
    send(answers.later, (5,), port=port)
    assert [receiver.recv().get(timeout=60) for _ in range(4)] == [10] * 4
    send(answers.later, (6,), port=port, selection="choose")
    assert receiver.recv().get(timeout=60) == 12
    with pytest.raises(MeshUsageError, match="selection"):
        send(answers.later, (1,), selection="some")
