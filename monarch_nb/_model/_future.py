"""One future type: awaitable in any asyncio loop and blocking with ``.get()``.

Results are produced on monarch_nb's I/O thread, a native thread, or a caller
waiting in ``get()`` that receives replies itself (never inside the caller's
asyncio loop), so the future is thread-safe and independent of asyncio.
``.get()`` blocks only the calling thread; because the I/O thread keeps
running, it is safe to call from inside a running event loop (a Jupyter cell)
without deadlock or ``nest_asyncio``. ``await fut`` bridges to whatever loop is
running at the await site.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _checks
from ._public import publish

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

_log = logging.getLogger("monarch_nb")
_PENDING = object()
# Guards every future's completion, latch and callback list: held for a few
# bytecodes at a time and never while a callback runs or a thread waits, so one
# lock for all costs less than a lock per future (made on every call). Nothing
# that allocates a container runs under it: on Python 3.11 such an allocation
# may start a garbage collection, whose finalizers (user code) could touch a
# future and wait on this lock forever.
_STATE_LOCK = threading.Lock()


def _fresh_state_lock() -> None:
    global _STATE_LOCK
    _STATE_LOCK = threading.Lock()  # a fork may copy it held by another thread


os.register_at_fork(after_in_child=_fresh_state_lock)
_SIGNAL_CHECK_S = 0.25
# Set in a worker: while its main thread waits on a future, it keeps serving
# messages to other actors of the process (else two actors of one process that
# call each other would wait forever). ``pump(future, timeout)`` returns when
# the future is done or the timeout passed.
_wait_pump: Callable[[Future[Any], float | None], None] | None = None
_pump_thread: int | None = None


# Set in a controller whose link writes a caller's later sends behind (see
# _unix_link.LinkRouter.write_behind): a thread about to wait on any future has
# its messages written first, and its next send goes out at once again.
_before_wait: Callable[[], None] | None = None


def set_before_wait(hook: Callable[[], None] | None) -> None:
    """Run ``hook()`` on each thread about to wait on a future (or ``await`` one)."""
    global _before_wait
    _before_wait = hook


def before_wait() -> None:
    """What a thread does before it waits for a reply (see :func:`set_before_wait`)."""
    hook = _before_wait
    if hook is not None:
        hook()


class _Deferred(threading.local):
    calls: list[tuple[Callable[[Any], None], Any]] | None = None


_deferred = _Deferred()


class deferred_callbacks:
    """Within it, futures this thread completes queue their done-callbacks; they
    run on leaving it (each error logged, not raised). For a thread that
    completes futures under a lock other threads need: a callback may block on
    them (stop a mesh, wait for another call)."""

    def __enter__(self) -> None:
        self._outer = _deferred.calls
        if self._outer is None:
            _deferred.calls = []

    def __exit__(self, *exc: object) -> None:
        if self._outer is not None:
            return  # an enclosing block runs them
        calls, _deferred.calls = _deferred.calls or [], None
        for callback, future in calls:
            try:
                callback(future)
            except Exception:
                _log.exception("monarch_nb: a future's done-callback failed")


def pumps_here() -> bool:
    """Whether waits on this thread serve other work (a worker's main thread)."""
    return _wait_pump is not None and threading.get_ident() == _pump_thread


def set_wait_pump(pump: Callable[[Future[Any], float | None], None] | None) -> None:
    """Install ``pump`` for waits on the calling thread (a worker's main thread)."""
    global _wait_pump, _pump_thread
    _wait_pump, _pump_thread = pump, threading.get_ident()


class Future(Generic[T]):
    """The eventual result of an operation on the mesh.

    Use ``fut.get(timeout=None)`` (or its alias ``fut.result()``) to block for the
    value, or ``await fut`` (or ``fut.as_asyncio()``) from a coroutine. All raise
    the operation's error if it failed.

    Example::

        value = actor.ping.call_one().get(timeout=5)
        value = await actor.ping.call_one()
    """

    # A future is made on every call, and a pipelined caller keeps thousands
    # alive: it owns no lock and no list until it needs one, so the garbage
    # collector, which scans every live container, has one object to look at.
    __slots__ = ("_callbacks", "_done", "_exception", "_latch", "_result")

    def __init__(self) -> None:
        if type(self) is Future:
            raise TypeError(
                "Future objects are returned by monarch_nb's operations (a call, a spawn, "
                "a fetch) and cannot be constructed directly, as in Monarch; for a value "
                "to send and receive, open a Channel (Channel.open() gives a port and "
                "its receiver)"
            )
        self._setup()

    @classmethod
    def _new(cls) -> Future[Any]:
        """A pending future (monarch_nb's own code makes them; users cannot)."""
        fut = object.__new__(Future)
        fut._setup()
        return fut

    def _setup(self) -> None:
        self._done = False
        self._result: Any = _PENDING
        self._exception: BaseException | None = None
        # Done-callbacks, under _STATE_LOCK; None until the first is added.
        self._callbacks: list[Callable[[Future[T]], None]] | None = None
        # Made (held) by the first thread that blocks on this future, released at
        # completion: waiting on a lock is cheaper than on an Event. Waiters
        # release it again at once, for the next one.
        self._latch: threading.Lock | None = None

    def _wait(self, timeout: float | None) -> bool:
        if _before_wait is not None:
            _before_wait()
        if self._done:
            return True
        pump = _wait_pump
        if pump is not None and threading.get_ident() == _pump_thread:
            pump(self, timeout)
            return self._done
        latch = threading.Lock()  # made and held before it is shared: see _STATE_LOCK
        latch.acquire()
        with _STATE_LOCK:
            if self._done:
                return True
            if self._latch is None:
                self._latch = latch
            else:
                latch = self._latch
        if timeout is None:
            # In slices: Ctrl-C delivered to another of this process's threads only
            # flags the signal, and a thread blocked in C never looks; between
            # slices Python runs the handler here, so KeyboardInterrupt is raised.
            # Done, too: a waiter interrupted between its acquire and its release
            # leaves the latch held for the others.
            while not latch.acquire(timeout=_SIGNAL_CHECK_S):
                if self._done:
                    return True
        elif not latch.acquire(timeout=max(0.0, timeout)):
            return self._done
        latch.release()
        return True

    # -- completion (internal: called by whoever produces the value) ---------

    def set_result(self, value: T) -> bool:
        """Complete with ``value``; returns False if it was already complete."""
        return self._complete(value, None)

    def set_exception(self, exc: BaseException) -> bool:
        """Complete with an error; returns False if it was already complete."""
        return self._complete(None, exc)

    def _complete(self, value: Any, exc: BaseException | None) -> bool:
        with _STATE_LOCK:
            if self._done:
                return False
            self._result, self._exception = value, exc
            callbacks, self._callbacks = self._callbacks, None
            self._done = True
            if self._latch is not None:
                self._latch.release()
        if not callbacks:
            return True
        deferred = _deferred.calls
        if deferred is not None:  # run once the completing thread's locks are free
            deferred.extend((callback, self) for callback in callbacks)
            return True
        for callback in callbacks:
            callback(self)
        return True

    # -- consumption ----------------------------------------------------------

    def done(self) -> bool:
        """True once a value or an error is available."""
        return self._done

    def add_done_callback(self, callback: Callable[[Future[T]], None]) -> None:
        """Run ``callback(self)`` on completion (at once if already done).

        The callback runs on the thread that completes the future: keep it short.
        """
        first = [callback] if self._callbacks is None else None  # see _STATE_LOCK
        with _STATE_LOCK:
            if not self._done:
                if self._callbacks is None:  # (another thread may have added first)
                    self._callbacks = first if first is not None else [callback]
                else:
                    self._callbacks.append(callback)
                return
        callback(self)

    def get(self, timeout: float | None = None) -> T:
        """Block until the result is ready and return it (or raise its error).

        Raises the error of the operation, or a ``TimeoutError`` subclass if
        ``timeout`` seconds pass first (the operation itself keeps going).
        ``timeout`` is seconds >= 0, or None (or ``math.inf``) to wait without
        limit; anything else raises MeshUsageError at once, the operation
        untouched (its value stays for the next ``get()``).
        """
        if timeout is not None:
            timeout = _checks.timeout(timeout, "get")
        return self._get(timeout, timeout)

    def _get(self, wait: float | None, timeout: float | None) -> T:
        """:meth:`get`, waiting at most ``wait`` s of the ``timeout`` asked for."""
        if not self._wait(wait) and not self._done:
            raise self._timeout_error(timeout)
        if self._exception is not None:
            raise self._exception
        return self._result

    def result(self, timeout: float | None = None) -> T:
        """The same as :meth:`get` (the name ``concurrent.futures`` and Monarch use)."""
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like ``get`` but return the error (or None) instead of raising it."""
        if timeout is not None:
            timeout = _checks.timeout(timeout, "exception")
        if not self._wait(timeout) and not self._done:
            raise self._timeout_error(timeout)
        return self._exception

    def _timeout_error(self, timeout: float | None) -> BaseException:
        # Subclasses name what is still missing (which ranks, which endpoint).
        return TimeoutError(f"the operation did not finish within {timeout} s")

    def __await__(self) -> Generator[Any, None, T]:
        if _before_wait is not None:
            _before_wait()
        if not self._done:
            import asyncio  # here, not at the top: workers start without asyncio

            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def wake(_: Future[T]) -> None:
                try:
                    loop.call_soon_threadsafe(_resolve, waiter)
                except RuntimeError:
                    pass  # the awaiting loop was closed; nobody is waiting any more

            self.add_done_callback(wake)
            yield from waiter.__await__()
        return self.get()

    def as_asyncio(self) -> asyncio.Future[T]:
        """An ``asyncio.Future`` of the running loop that completes with this one.

        Call it from a coroutine (it needs a running loop; RuntimeError otherwise).
        Each call gives a fresh asyncio future; none of them consumes this one,
        so ``get()`` and ``await`` still work, and cancelling the asyncio future
        does not cancel the operation.
        """
        import asyncio

        loop = asyncio.get_running_loop()  # RuntimeError off a loop, as Monarch's
        if _before_wait is not None:
            _before_wait()
        mirror: asyncio.Future[T] = loop.create_future()

        def copy(_: Future[T]) -> None:
            try:
                loop.call_soon_threadsafe(_copy_into, mirror, self)
            except RuntimeError:
                pass  # the loop was closed; nobody is waiting any more

        self.add_done_callback(copy)
        return mirror

    def __repr__(self) -> str:
        if not self.done():
            state = "pending"
        elif self._exception is not None:
            state = f"failed: {type(self._exception).__name__}"
        else:
            state = "done"
        return f"<{self._repr_name()} {state}>"

    def _repr_name(self) -> str:
        return type(self).__name__


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _copy_into(mirror: asyncio.Future[Any], source: Future[Any]) -> None:
    if mirror.done():
        return  # cancelled by its awaiter
    exc = source._exception
    if exc is None:
        mirror.set_result(source._result)
    elif isinstance(exc, StopIteration):  # asyncio refuses it, as a coroutine would
        mirror.set_exception(RuntimeError(f"the operation raised StopIteration: {exc!r}"))
    else:
        mirror.set_exception(exc)


def completed(value: T) -> Future[T]:
    """A future that already holds ``value``."""
    fut: Future[T] = Future._new()
    fut.set_result(value)
    return fut


def done_as_none(source: Future[Any]) -> Future[None]:
    """A future of None that completes when ``source`` does, with its error if any."""
    fut: Future[None] = Future._new()

    def copy(_: Future[Any]) -> None:
        exc = source._exception
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)

    source.add_done_callback(copy)
    return fut


def failed(exc: BaseException) -> Future[Any]:
    """A future that already holds the error ``exc``."""
    fut: Future[Any] = Future._new()
    fut.set_exception(exc)
    return fut


publish(globals())
