"""A caller that waits for a reply receives it itself: the controller's caller side.

See :mod:`._client`'s docstring for who receives what. A caller waiting in
``get()`` takes the replies off the local workers' socket and completes calls
on its own thread; everything else it receives, and every message after one
of those, goes to the I/O thread in order. On a Unix link a caller's sends in
a burst are written behind, in one write per worker, when it waits.

:class:`CallerReceiver` is the part of :class:`~._client.Controller` that does
this, with the state it owns; the controller is its only subclass.
"""

from __future__ import annotations

import _signal
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._model._future import Future, deferred_callbacks, pumps_here
from .._wire._eventfd import clear_eventfd
from .._wire._messages import Message, Value
from .._wire._signed import ReplayWindow, WireStats, sender_tag

if TYPE_CHECKING:
    import zmq

    from .._runtime._pending import PendingCall
    from .._wire._unix_link import LinkRouter
    from ._group_protocol import ClientGroup
    from ._io_loop import IOLoop

# A receiving caller's poll, in slices: Python runs a signal handler (Ctrl-C)
# between them.
_RECEIVE_SLICE_MS = 250
_SIGINT = _signal.SIGINT
# Python runs signal handlers on this thread only, so only it defers Ctrl-C.
_MAIN_THREAD = threading.main_thread().ident
_log = logging.getLogger("monarch_nb")
HANDLING_FAILED = "monarch_nb: handling a message from a worker failed"


class Peer:
    """A worker as the controller knows it: its group, rank, seal and replay window."""

    __slots__ = ("group", "rank", "tag", "via", "window")

    def __init__(self, identity: bytes, group: ClientGroup, rank: int, via: bytes | None) -> None:
        self.group, self.rank, self.window = group, rank, ReplayWindow()
        self.tag = sender_tag(identity)  # what its messages must be sealed by
        self.via = via  # the agent that relays for it, or None


Verified = tuple[Peer, Message, list[Any]]


class CallerReceiver:
    """Receiving on a waiting caller's thread, and writing a caller's sends behind."""

    if TYPE_CHECKING:  # the controller's, which this part uses
        loop: IOLoop
        stats: WireStats
        router: zmq.Socket
        _link: LinkRouter | None
        _router_fd: int
        _closed: bool
        _calls: dict[int, PendingCall]
        _handoff: deque[Verified]
        _dispatch_lock: threading.RLock

        def _rewatch(self) -> None: ...
        def _on_readable(self) -> None: ...
        def _hand_off(self, verified: Verified) -> None: ...
        def _on_value(self, call_id: int, rank: int, body: list[Any]) -> None: ...
        def _take_all(
            self, router: zmq.Socket, from_hosts: bool, handle: Callable[[Verified], None]
        ) -> None: ...

    def _init_caller_receive(self) -> None:
        self._receive_slot = threading.Lock()  # held by the caller receiving now
        self.caller_receiving = False
        self._caller_wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._caller_poller: select.poll | None = None
        self._receiver_ident = 0  # the receiving caller's thread
        self._sigint: tuple[Any] | None = None  # a Ctrl-C the receiving main thread deferred
        # On a Unix link, per caller thread: sends since it last waited on a
        # future, and whether it sent several before its last wait (a burst).
        # They say which sends are written behind (see _write_behind).
        self._sends_unwaited: dict[int, int] = {}
        self._bursting: set[int] = set()

    def _write_behind(self) -> bool:
        """Whether this send waits behind (under ``_lock``, on a Unix link).

        A caller's second send before it waits for anything does, and so does
        its first where it sent several before its last wait (it sends in
        bursts: a gather of several calls, a pipeline); they wait until the
        caller waits on a future (:func:`_callers_wait`), or for the link's short
        timer, and each worker gets them in one write: a worker of a gather
        wakes once, not once a call (on two cores with 128 processes a wake-up
        costs more than the call). A caller of one call at a time sends at
        once, so its round trip is as before. Never on the I/O thread: nothing
        there waits on a future to write them."""
        if self.loop.in_loop_thread:
            return False
        ident = threading.get_ident()
        sent = self._sends_unwaited.get(ident, 0)
        self._sends_unwaited[ident] = sent + 1
        return sent > 0 or ident in self._bursting

    def caller_waits(self) -> None:
        """This thread is about to wait for a reply: write what waits behind."""
        if self._sends_unwaited:
            ident = threading.get_ident()
            sent = self._sends_unwaited.pop(ident, 0)
            if sent > 1:
                self._bursting.add(ident)
            elif sent == 1:
                self._bursting.discard(ident)
        link = self._link
        if link is not None and link._behind:
            link.flush_behind()

    def receive_until_done(
        self,
        future: Future[Any],
        deadline: float | None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Receive the workers' replies on this thread until ``future`` completes,
        ``deadline`` (monotonic) passes, or ``stop()`` is true (checked after each
        batch and each :meth:`wake_receiver`). Returns at once where it cannot
        help: on the I/O thread, after shutdown, or while another caller receives
        (whose replies complete this future too; the caller then waits as before)."""
        if future.done() or self._closed or self.loop.in_loop_thread:
            return
        if not self._receive_slot.acquire(blocking=False):
            return
        interrupt = self._defer_sigint()
        try:
            poller = self._caller_poller
            if poller is None:
                poller = self._caller_poller = select.poll()
                poller.register(self._router_fd, select.POLLIN)
                poller.register(self._caller_wake, select.POLLIN)
            self._receiver_ident = threading.get_ident()
            future.add_done_callback(self._poke_caller)  # completed on another thread
            self.caller_receiving = True
            while True:
                self._receive_on_caller()
                if future.done() or self._closed or self._sigint is not None:
                    return
                if stop is not None and stop():
                    return
                wait_ms = _RECEIVE_SLICE_MS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    wait_ms = min(wait_ms, int(left * 1000) + 1)
                for fd, _ in poller.poll(wait_ms):
                    if fd == self._caller_wake:
                        clear_eventfd(fd)
        finally:
            self.caller_receiving = False
            self._receiver_ident = 0
            self._receive_slot.release()
            if self._calls or self._handoff:
                # Other calls wait for replies: the I/O thread takes the socket back
                # now, not at its timer.
                try:
                    self.loop.call_soon(self._rewatch)
                except RuntimeError:
                    pass  # shut down
            if interrupt is not None:
                self._restore_sigint(interrupt)  # raises a deferred KeyboardInterrupt

    def wake_receiver(self) -> None:
        """Make the receiving caller, if any, look up (at its ``stop``) now."""
        os.eventfd_write(self._caller_wake, 1)

    def _defer_sigint(self) -> Callable[..., Any] | None:
        """On the main thread, hold Ctrl-C while this caller receives: raised in the
        middle of a batch it would lose replies taken off the socket (other
        threads' too). The wait's poll wakes for it, and :meth:`_restore_sigint`
        raises it on the way out, by the handler that was installed. Returns that
        handler; None where there is nothing to hold (another thread, or SIGINT
        not handled in Python).

        Through ``_signal``, the C module: ``signal.signal`` and ``getsignal``
        look every handler up as an enum member first, which cost more than the
        rest of a no-op call's receive (about 10 us a call on a quiet machine)."""
        if threading.get_ident() != _MAIN_THREAD:
            return None
        previous = _signal.getsignal(_SIGINT)
        if not callable(previous):
            return None
        self._sigint = None
        _signal.signal(_SIGINT, self._hold_sigint)
        return previous

    def _hold_sigint(self, signum: int, frame: Any) -> None:
        self._sigint = (frame,)
        os.eventfd_write(self._caller_wake, 1)

    def _restore_sigint(self, previous: Callable[..., Any]) -> None:
        """Put back the handler :meth:`_defer_sigint` replaced, and raise through it
        a Ctrl-C that came meanwhile."""
        _signal.signal(_SIGINT, previous)
        came, self._sigint = self._sigint, None
        if came is not None:
            previous(_SIGINT, came[0])

    def _input_pending(self) -> None:
        """A send saw input waiting, and its check took the fd's notice of it:
        receive it on this thread if nobody receives now (most often this caller
        is about to wait for the reply anyway), else wake who does."""
        if (
            not self.loop.in_loop_thread
            and not pumps_here()
            and self._receive_slot.acquire(blocking=False)
        ):
            interrupt = self._defer_sigint()
            try:
                self._receive_on_caller()
            finally:
                self._receive_slot.release()
                if interrupt is not None:
                    self._restore_sigint(interrupt)
            return
        if self.caller_receiving:
            os.eventfd_write(self._caller_wake, 1)
        try:
            self.loop.call_soon(self._on_readable)  # and the I/O thread, to be sure
        except RuntimeError:
            pass  # shut down

    def _poke_caller(self, _future: Future[Any]) -> None:
        if threading.get_ident() != self._receiver_ident:  # it completed its own: awake
            os.eventfd_write(self._caller_wake, 1)

    def _receive_on_caller(self) -> None:
        """Take what the workers' socket holds: replies are handled here, anything
        else (and all after it) goes to the I/O thread, in order. Done-callbacks
        of the futures completed here run after the lock is released: one may
        need the I/O thread, which may be waiting for the lock."""
        with deferred_callbacks(), self._dispatch_lock:
            self._take_all(self.router, False, self._handle_on_caller)

    def _handle_on_caller(self, verified: Verified) -> None:
        peer, message, body = verified
        if self._handoff or type(message) is not Value:
            self._hand_off(verified)  # in order: behind whatever went before it
            return
        self.stats.replies_to_callers += 1
        try:  # what _handle_safely and _handle do for a Value, two calls fewer per reply
            self._on_value(message.call_id, peer.rank, body)
        except Exception:
            _log.exception(HANDLING_FAILED)
