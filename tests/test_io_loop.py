"""The controller's I/O loop: callbacks handed to it from other threads."""

from __future__ import annotations

import threading

import pytest

from monarch_nb._controller._io_loop import IOLoop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def loop():
    loop = IOLoop(name="monarch_nb-io-test")
    yield loop
    loop.stop()
    assert not loop._thread.is_alive()


def test_batched_callbacks_run_together_on_the_loop_thread_with_nothing_else_to_wake_it(loop):
    ran: list[tuple[int, str]] = []
    done = threading.Event()

    def note(i: int) -> None:
        ran.append((i, threading.current_thread().name))
        if len(ran) == 50:
            done.set()

    for i in range(50):
        loop.call_soon_batched(lambda i=i: note(i))
    assert done.wait(30), f"{len(ran)} of 50 batched callbacks ran"
    assert [i for i, _ in ran] == list(range(50))  # in order
    assert {name for _, name in ran} == {"monarch_nb-io-test"}


def test_a_prompt_callback_does_not_wait_for_a_batch(loop):
    batched, prompt = threading.Event(), threading.Event()
    loop.call_soon_batched(batched.set)
    loop.call_soon(prompt.set)
    assert prompt.wait(30)
    assert batched.wait(30)


def test_batched_callbacks_queued_before_stop_still_run():
    loop = IOLoop(name="monarch_nb-io-test")
    ran = threading.Event()
    loop.call_soon_batched(ran.set)
    loop.stop()
    assert ran.is_set()
    with pytest.raises(RuntimeError, match="stopped"):
        loop.call_soon_batched(ran.set)
