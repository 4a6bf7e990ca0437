import asyncio
import threading

import pytest

from monarch_nb import Future


def complete_later(fut: Future, value: object, delay: float = 0.05) -> None:
    threading.Timer(delay, fut.set_result, args=(value,)).start()


def test_get_blocks_until_another_thread_completes():
    fut: Future[int] = Future._new()
    complete_later(fut, 7)
    assert fut.get(timeout=5) == 7
    assert fut.done()


def test_get_raises_the_error_and_times_out_clearly():
    fut: Future[int] = Future._new()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.01 s"):
        fut.get(timeout=0.01)
    fut.set_exception(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        fut.get()
    assert not fut.set_result(1), "a future completes once"


def test_await_from_a_running_loop():
    async def main() -> int:
        fut: Future[int] = Future._new()
        complete_later(fut, 3)
        return await fut

    assert asyncio.run(main()) == 3


def test_get_inside_a_running_loop_does_not_deadlock():
    # What a Jupyter cell does: .get() while the kernel's loop is running.
    async def main() -> int:
        fut: Future[int] = Future._new()
        complete_later(fut, 5)
        return fut.get(timeout=5)

    assert asyncio.run(main()) == 5


def test_done_callbacks_run_once_even_when_added_late():
    fut: Future[str] = Future._new()
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

    fut: Future[int] = Future._new()
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


def test_result_is_get():
    fut: Future[int] = Future._new()
    complete_later(fut, 3)
    assert fut.result(timeout=5) == 3
    pending: Future[int] = Future._new()
    with pytest.raises(TimeoutError):
        pending.result(timeout=0.01)


def test_as_asyncio_gives_a_fresh_asyncio_future_each_time():
    async def main(fut: Future[int]) -> tuple[int, int, bool]:
        first, second = fut.as_asyncio(), fut.as_asyncio()
        assert isinstance(first, asyncio.Future)
        assert first is not second
        return (
            await first,
            await asyncio.wait_for(second, 5),
            first.get_loop() is asyncio.get_running_loop(),
        )

    fut: Future[int] = Future._new()
    complete_later(fut, 9)
    assert asyncio.run(main(fut)) == (9, 9, True)
    assert fut.get() == 9  # not consumed
    assert asyncio.run(main(fut)) == (9, 9, True)  # already done: still answers


def test_as_asyncio_carries_errors_and_needs_a_running_loop():
    fut: Future[int] = Future._new()
    fut.set_exception(ValueError("boom"))

    async def main() -> None:
        await fut.as_asyncio()

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(main())
    with pytest.raises(RuntimeError, match="no running event loop"):
        fut.as_asyncio()

    stopped: Future[int] = Future._new()
    stopped.set_exception(StopIteration())  # asyncio refuses StopIteration, as a coroutine does

    async def main2() -> None:
        await stopped.as_asyncio()

    with pytest.raises(RuntimeError, match="StopIteration"):
        asyncio.run(main2())


def test_cancelling_the_asyncio_future_leaves_the_operation_alone():
    fut: Future[int] = Future._new()

    async def main() -> None:
        mirror = fut.as_asyncio()
        mirror.cancel()
        with pytest.raises(asyncio.CancelledError):
            await mirror

    asyncio.run(main())
    fut.set_result(1)
    assert fut.get() == 1


def test_many_threads_wait_on_one_future_and_all_wake():
    fut: Future[int] = Future._new()
    got: list[int] = []
    waiters = [threading.Thread(target=lambda: got.append(fut.get(timeout=30))) for _ in range(8)]
    for waiter in waiters:
        waiter.start()
    complete_later(fut, 3, delay=0.2)
    for waiter in waiters:
        waiter.join(30)
    assert got == [3] * 8


def test_a_forked_child_can_use_futures_while_the_parent_held_their_lock():
    # Futures share one lock; a fork while another thread held it (a rank's wire
    # thread completing a call as a DataLoader forks) must not leave the child's
    # futures locked forever.
    import os

    from monarch_nb._model import _future

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _future._STATE_LOCK:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    try:
        pid = os.fork()
        if pid == 0:  # the child: the holder thread is gone, its lock copied held
            code = 1
            try:
                child: Future[int] = Future._new()
                child.set_result(5)
                child.add_done_callback(lambda f: None)
                code = 0 if child.get(timeout=5) == 5 else 1
            finally:
                os._exit(code)
        waited = 0
        for _ in range(300):  # up to 30 s: a deadlocked child never exits
            waited, status = os.waitpid(pid, os.WNOHANG)
            if waited:
                break
            threading.Event().wait(0.1)
        if not waited:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child's futures deadlocked on a lock copied held")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join(30)
