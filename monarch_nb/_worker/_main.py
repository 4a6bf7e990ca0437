"""The worker process: runs actors and cells on its main thread, one message at a time.

Started as ``python -m monarch_nb.worker`` with its bootstrap (address,
identity, signing key, rank) as one JSON line on stdin. The wire thread
(:mod:`._wire_thread`) receives every message and hands work here through a
queue, so calls to an actor start in the order they were sent; replies go out
from this thread directly. A call of an ``async def`` endpoint becomes a task
on the actors' event loop (:mod:`._endpoint_tasks`), which runs between messages:
such calls interleave at their awaits.

A :class:`Worker` is made of parts, each owning its state, lowest first::

    _answers   how a call is answered: its value, or its failure, on its route
    _running   the call the main thread runs, the calls queued, interrupts
    _inbox     the queue of work, the main thread's waits, the actors' event loop
    _actors    the actors this process hosts: spawns, calls, stops, supervision
    _cells     the ``%%mesh`` cells' namespace (:mod:`._namespace`), push and pull
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import zmq

from .._model._future import set_wait_pump
from .._model._shape import Shape
from .._runtime import _context, _peer, _refs
from .._runtime._context import Context
from .._runtime._peer import PeerNode
from .._services import _metrics
from .._services._descendants import become_subreaper, kill_descendants
from .._services._dist import keep_store_on_loopback
from .._services._proc_bind import start_rank
from .._wire._fd_limits import raise_fd_limit
from .._wire._messages import (
    Call,
    Hello,
    Message,
    ProtocolError,
    Pull,
    Push,
    Renumber,
    RunCell,
    Shutdown,
    Spawn,
    StopActor,
    Value,
)
from .._wire._signed import Signer, WireStats, sender_tag
from .._wire._unix_link import SCHEME as LINK_SCHEME
from .._wire._unix_link import LinkDealer
from . import _zygote
from ._actors import Actors
from ._answers import FAILED, Answers, ControllerRoute, Route
from ._cells import Cells
from ._inbox import Inbox
from ._log_file import install as install_log_file
from ._running import Running
from ._wire_thread import WireThread

DEFAULT_HEARTBEAT_S = 1.0


class Worker:
    """One worker's main thread: its link to the controller, and the parts it is made of."""

    def __init__(self, boot: dict[str, Any]) -> None:
        self.rank: int = boot["rank"]
        labels, sizes = boot["shape"]
        self.shape = Shape.from_sizes(dict(zip(labels, sizes, strict=False)))
        self.mesh_name: str = boot["mesh"]
        self.zmq = zmq.Context()
        if boot["address"].startswith(LINK_SCHEME):
            sock: Any = LinkDealer(boot["address"], boot["identity"].encode())
        else:
            sock = self.zmq.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, boot["identity"].encode())
            sock.setsockopt(zmq.LINGER, 2000)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(boot["address"])
        self.socket = sock
        self.signer = Signer(
            bytes.fromhex(boot["key"]),
            WireStats(),
            sender=sender_tag(boot["identity"].encode()),
            upstream=True,
            # A Unix socket in the private run directory (ours, or our host
            # agent's); a plain TCP port (MONARCH_NB_BIND) is not trusted.
            trusted_link=boot["address"].startswith(("ipc://", LINK_SCHEME)),
        )
        # Made before the wire thread, which takes their callbacks; given it after.
        self.running = running = Running(self)
        self.inbox = inbox = Inbox(
            self.signer.stats, running.queued_item, running.nestable, running.handle_nested
        )
        self.post = inbox.post
        _metrics.on_a_rank()  # log_metric() now records, for the heartbeats to carry
        self.wire = WireThread(
            sock,
            self.signer,
            deliver=inbox.deliver,
            busy=running.busy,
            interrupt=running.interrupt,
            controller_pid=boot["controller_pid"],
            heartbeat_s=float(boot.get("heartbeat_s", DEFAULT_HEARTBEAT_S)),
        )
        self.send = self.wire.send
        self.wire.wake_main = inbox.poke_main
        self.controller_route = ControllerRoute(self.wire, self.signer)
        running.wire = inbox.wire = self.wire
        inbox.controller_route = self.controller_route
        self.answers = Answers(self, self.controller_route)
        running.run_async = inbox.run_async
        self.peer: PeerNode | None = None
        self.procs_ref: _refs.ProcsRef | None = None
        if "peer" in boot:  # actors elsewhere may call ours: bind our inbox
            peer = boot["peer"]
            self.procs_ref = _refs.ProcsRef.from_json(peer["ref"])
            _peer.set_tree_key(bytes.fromhex(peer["key"]))
            _peer.set_tree_curve(peer["curve"])
            if peer.get("tcp"):  # a mesh on several hosts: other hosts reach us by TCP
                host = os.environ.get("MONARCH_NB_RDMA_HOST") or "127.0.0.1"
                self.peer = PeerNode(None, _peer.tree_key(), tcp_host=host)
                self.procs_ref = dataclasses.replace(
                    self.procs_ref, table=_refs.compact_table({self.rank: self.peer.address})
                )
            else:
                self.peer = PeerNode(self.procs_ref.address(self.rank), _peer.tree_key())
            self.peer.on_work = inbox.deliver_from_peer
            self.peer.home = (self.procs_ref, self.rank)
            self.peer.on_interrupt = lambda sender, call_id: running.interrupt_ticket(
                (sender, call_id)
            )
            _peer.install_node(self.peer)
        self.actors = Actors(self, running, inbox, self.answers)
        self.cells = Cells(self, running, self.answers)
        self.wire.describe_awaiting = self.actors.describe_awaiting
        running.on_call = self.actors.on_call
        running.on_other = self._handle
        running.catch_interrupts()
        set_wait_pump(inbox.pump)
        _context.set_supervision_hook(self.actors.on_child_failure)

    def run(self) -> None:
        self.wire.start()
        tcp = self.peer.tcp_address if self.peer is not None else ""
        self.send(Hello(os.getpid(), socket.gethostname(), tcp))
        self.inbox.serve(self.running.handle)

    def _handle(self, message: Message, frames: list[Any], route: Route) -> bool:
        """Handle one work message other than a :class:`Call` from the controller's
        link (those go to the actors directly); False means shut down."""
        from_controller = route is self.controller_route
        match message:
            case Call():
                self.actors.on_call(message, frames, route)
            case Spawn():
                self.actors.on_spawn(message, frames, route)
            case RunCell() | Push() | Pull() if from_controller:
                self.cells.on_cell(message, frames)
            case Renumber(call_id) if from_controller:
                self.on_renumber(call_id, frames)
            case StopActor(actor_id, call_id):
                self.actors.stop(actor_id)
                if call_id:  # the stop's future: done once __cleanup__ has run
                    route.send(Value(call_id))
            case Shutdown() if from_controller:
                self.actors.stop_all()
                self.inbox.stop_tasks()
                return False
            case _:
                self.send(ProtocolError(f"a worker does not handle {type(message).__name__}"))
        return True

    def on_renumber(self, call_id: int, frames: list[Any]) -> None:
        """This process moved into a resized mesh: take its new rank, shape,
        environment and inbox table. The actors of the old mesh are stopped
        (their meshes cannot follow a renumbering); the namespace is kept."""
        decoded = self.answers.decode_or_fail(call_id, True, "renumber", frames)
        if decoded is FAILED:
            return
        self.rank = decoded["rank"]
        self.shape = Shape.from_sizes(dict(zip(decoded["labels"], decoded["sizes"], strict=True)))
        os.environ.update(decoded["env"])
        if self.peer is not None:
            self.procs_ref = decoded["ref"]
            self.peer.home = (self.procs_ref, self.rank)
        self.actors.stop_all()
        # torch.distributed's default group was made for the old world (its size,
        # ranks and store): leave it, so the next init_process_group() (a cell, the
        # tensor engine) makes the new one. Only if torch is loaded: never import it.
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self.cells.renumber()
        self.answers.reply_value(call_id, None)


def _no_debugger(*args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` on a rank whose controller serves no debugger prompt."""
    raise RuntimeError(
        "breakpoint() on a rank needs a debugger prompt on the controller, and this "
        "mesh was started without one: in a script call monarch_nb.debug.install() "
        "before spawn_procs() (a notebook's %load_ext monarch_nb does it); "
        "PYTHONBREAKPOINT=0 makes breakpoint() do nothing"
    )


def _die_with_parent(controller_pid: int) -> None:
    """SIGKILL this process the instant its controller dies (Linux's parent-death
    signal): no orphans even while user code holds the GIL. The wire thread's
    ``getppid()`` check stays as the fallback where prctl is missing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != controller_pid:  # it died before prctl took effect
        os._exit(70)


_PR_SET_PDEATHSIG = 1


_this_worker: Worker | None = None


def live_actor(actor_id: int) -> tuple[Any, Context, Callable[[Any], Any]] | None:
    """The instance and context of actor ``actor_id`` if it lives in this process, and
    what runs its coroutines (the actors' event loop): for layers above the core that
    call a neighbour directly (the tensor engine's rref)."""
    worker = _this_worker
    live = worker.actors.live.get(actor_id) if worker is not None else None
    if worker is None or live is None:
        return None
    return live.instance, live.context, worker.inbox.run_async


def _quiet_torch_without_numpy() -> None:
    """Keep torch's "Failed to initialize NumPy" warning out of every rank's output.

    torch's CPU wheel installs no numpy, and ``import torch`` then warns on
    each rank, which reads like an error in the cell. Nothing here needs numpy
    (tensors cross the wire without it), and user code calling ``.numpy()``
    still gets torch's own error saying numpy is missing.
    """
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


def main() -> None:
    boot = json.loads(sys.stdin.buffer.readline())
    if "zygote" in boot:  # this process forks ranks: returns only in a forked one
        boot = _zygote.serve(boot["zygote"])
    run(boot)


def run(boot: dict[str, Any]) -> None:
    """Be the rank ``boot`` describes until told to stop (exits the process)."""
    global _this_worker
    # Interrupts are how calls stop: whatever mask or disposition the process
    # that launched us had (a blocked or ignored SIGINT is inherited), take
    # SIGINT back for the main thread.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with_parent(boot["controller_pid"])
    # What user code starts stays in this rank's tree, even after a setsid and its
    # parent's exit, to be killed with it (see _services._descendants).
    become_subreaper()
    keep_store_on_loopback()  # torch's store would listen on every interface
    raise_fd_limit()  # user code may open many; the agent or controller raised it already
    # A segfault or abort prints every thread's Python stack to fd 2, which the
    # controller reads to the end before it reports the death.
    faulthandler.enable(file=2, all_threads=True)
    _quiet_torch_without_numpy()
    # spawn_procs(proc_bind=, bootstrap=): before anything of the user's runs
    start_rank(boot, boot["rank"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # user code calling input() gets EOF, not our bootstrap pipe
    os.close(devnull)
    log = install_log_file(boot["mesh"], boot["rank"])
    worker = _this_worker = Worker(boot)
    worker.running.log = log
    if not os.environ.get("PYTHONBREAKPOINT"):
        # stdin is /dev/null: pdb would quit at once (a bare BdbQuit). The
        # debugger's install_on_worker below replaces this with its prompt.
        sys.breakpointhook = _no_debugger
    # Layers above the core that must be in place before user code runs (the
    # debugger's breakpoint hook): each module's install_on_worker(worker).
    for name in boot.get("imports", ()):
        importlib.import_module(name).install_on_worker(worker)
    code = 0
    try:
        worker.run()
    except BaseException:
        traceback.print_exc()  # a bug in the loop itself: say it, and exit non-zero
        code = 70
    finally:
        kill_descendants(os.getpid())  # nothing a rank started outlives it
        sys.stdout.flush()
        sys.stderr.flush()
        worker.wire.stop()
        if worker.peer is not None:
            worker.peer.close()
        with worker.wire.lock:
            worker.socket.close()
        if code:
            os._exit(code)
    # Asked to stop: end as Python ends, so that atexit handlers and module
    # globals' __del__ run, as on Monarch's graceful stop. A thread that user
    # code left running would hold that exit forever: a deadline ends it.
    _exit_after(_FINALIZE_S, code)
    sys.exit(code)


# How long a stopped worker's interpreter may take to finalize (the controller's
# grace, STOP_GRACE_S, is longer: it kills what is left after that).
_FINALIZE_S = 3.0


def _exit_after(seconds: float, code: int) -> None:
    """``os._exit(code)`` in ``seconds``, from a daemon thread, unless the process
    has exited by then."""

    def wait_then_exit() -> None:
        time.sleep(seconds)
        os._exit(code)

    threading.Thread(target=wait_then_exit, name="monarch_nb-exit", daemon=True).start()
