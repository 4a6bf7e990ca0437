import asyncio
import threading

import pytest

from monarch_nb import Future


def complete_later(fut: Future, value: object, delay: float = 0.05) -> None:
    threading.Timer(delay, fut.set_result, args=(value,)).start()


def test_get_blocks_until_another_thread_completes():
    fut: Future[int] = Future()
    complete_later(fut, 7)
    assert fut.get(timeout=5) == 7
    assert fut.done()


def test_get_raises_the_error_and_times_out_clearly():
    fut: Future[int] = Future()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.01 s"):
        fut.get(timeout=0.01)
    fut.set_exception(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        fut.get()
    assert not fut.set_result(1), "a future completes once"


def test_await_from_a_running_loop():
    async def main() -> int:
        fut: Future[int] = Future()
        complete_later(fut, 3)
        return await fut

    assert asyncio.run(main()) == 3


def test_get_inside_a_running_loop_does_not_deadlock():
    # What a Jupyter cell does: .get() while the kernel's loop is running.
    async def main() -> int:
        fut: Future[int] = Future()
        complete_later(fut, 5)
        return fut.get(timeout=5)

    assert asyncio.run(main()) == 5


def test_done_callbacks_run_once_even_when_added_late():
    fut: Future[str] = Future()
    seen: list[str] = []
    fut.add_done_callback(lambda f: seen.append(f.get()))
    fut.set_result("x")
    fut.add_done_callback(lambda f: seen.append(f.get() + "!"))
    assert seen == ["x", "x!"]


def test_ctrl_c_reaching_another_thread_still_stops_a_blocked_get():
    # The kernel may hand a process's SIGINT to any thread that does not block
    # it; the thread blocked in get() must still raise KeyboardInterrupt.
    import signal
    import time

    # Python's own Ctrl-C, whatever an earlier test or the launcher left behind.
    old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)

    fut: Future[int] = Future()
    safety = threading.Timer(10, fut.set_result, args=(0,))  # never hang the suite
    safety.start()

    def signal_this_thread() -> None:
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    helper = threading.Thread(target=signal_this_thread)
    helper.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            fut.get()
        assert time.monotonic() - started < 8  # well before the 10 s safety result
    finally:
        helper.join()
        safety.cancel()
        signal.signal(signal.SIGINT, old_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
