"""The worker processes behind a process mesh, and their life cycle.

A :class:`ProcGroup` starts ``python -m monarch_nb.worker`` once per rank,
hands each its bootstrap (signing key included) through a stdin pipe, so no
secret is ever on a command line, and watches them from the I/O thread:
a pidfd per process reports an exit the instant it happens, and the
stdout/stderr pipes are forwarded line by line.

Life cycle, a small closed set of states::

    Starting -> Running -> Failed(cause) -> (restart) Starting ...
                        \\-> Stopped
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _context
from ._controller import Controller, WorkerOutput
from ._errors import MeshFailure, MeshUsageError, RemoteError
from ._shape import Shape
from ._wire import Signer, decode_payload, new_key

_log = logging.getLogger("monarch_nb")
_group_ids = itertools.count(1)
START_TIMEOUT_S = float(os.environ.get("MONARCH_NB_START_TIMEOUT", "60"))
STOP_GRACE_S = 5.0
_STDERR_TAIL_LINES = 20


@dataclass(frozen=True)
class Starting:
    pass


@dataclass(frozen=True)
class Running:
    pass


@dataclass(frozen=True)
class Failed:
    error: MeshFailure


@dataclass(frozen=True)
class Stopped:
    pass


State = Starting | Running | Failed | Stopped


def describe_exit(returncode: int) -> str:
    """``-9`` -> ``"was killed by signal SIGKILL"``; ``3`` -> ``"exited with code 3"``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"was killed by signal {name}"
    return f"exited with code {returncode}"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (no torch import)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        devices = []
        for entry in (d.strip() for d in listed.split(",")):
            if not entry or entry == "-1":
                break  # CUDA stops at the first invalid entry
            devices.append(entry)
        return devices
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


class WorkerProcess:
    """One worker: its process, pipes and identity (touched on the I/O thread)."""

    def __init__(self, rank: int, identity: bytes, popen: subprocess.Popen[bytes]) -> None:
        self.rank = rank
        self.identity = identity
        self.popen = popen
        self.pid = popen.pid
        self.pidfd = os.pidfd_open(popen.pid)
        self.returncode: int | None = None
        self.partial = {"stdout": b"", "stderr": b""}
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)


class ProcGroup:
    """The processes of one ``spawn_procs`` (all its views share this object)."""

    def __init__(
        self,
        sizes: Mapping[str, int],
        *,
        env: Mapping[str, str] | None = None,
        gpus: bool = False,
        name: str = "procs",
    ) -> None:
        self.id = next(_group_ids)
        self.name = name
        self.shape = Shape.from_sizes(sizes)
        self.extra_env = dict(env or {})
        self.gpus = gpus
        self.controller = Controller.get()
        self.controller.groups.add(self)
        self.generation = 0
        self.state: State = Starting()
        self.workers: list[WorkerProcess] = []
        self._key = b""  # a fresh key and signer for every start()
        self.signer: Signer
        self.owner = _context.current_actor_or_none()  # who supervises us, if an actor
        self.actor_failures: dict[int, MeshFailure] = {}
        self.ready_ranks: set[int] = set()  # ranks of this generation that said hello
        self._all_ready = threading.Event()
        self._listeners: list[Callable[[str, Any], None]] = []

    # -- starting -------------------------------------------------------------

    def start(self) -> None:
        """Start every worker and wait until each said hello (blocking)."""
        self.generation += 1
        self.state = Starting()
        self.actor_failures.clear()
        key = self._key = new_key()
        self.signer = Signer(key, self.controller.stats)
        self._all_ready.clear()
        self.ready_ranks = set()
        ranks = range(len(self.shape))
        identities = [f"{self.id}.{self.generation}.{rank}".encode() for rank in ranks]
        # Known before any worker exists: a fast worker's hello must not find
        # its identity unknown (and be dropped) while we still start the others.
        self.controller.run(lambda: self._register_peers(identities))
        base_env = self._base_env(self.controller.bind_host)
        workers = [self._launch(r, identities[r], key, base_env) for r in ranks]
        self.controller.run(lambda: self._watch(workers))
        if not self._all_ready.wait(START_TIMEOUT_S):
            self.kill()
            raise MeshFailure(
                f"{self.name}: workers did not start within {START_TIMEOUT_S} s "
                "(set MONARCH_NB_START_TIMEOUT to wait longer)",
                ranks=self.shape.ranks,
            )
        if isinstance(self.state, Failed):
            error = self.state.error
            self.kill()  # the ranks that did start must not outlive a failed start
            raise error

    def _base_env(self, host: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            WORLD_SIZE=str(len(self.shape)),
            LOCAL_WORLD_SIZE=str(len(self.shape)),
            MASTER_ADDR=host,
            MASTER_PORT=str(free_port(host)),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def _launch(
        self, rank: int, identity: bytes, key: bytes, base_env: dict[str, str]
    ) -> WorkerProcess:
        env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus()[rank]
        popen = subprocess.Popen(
            [sys.executable, "-m", "monarch_nb.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the controller only
        )
        bootstrap = {
            "address": self.controller.address,
            "identity": identity.decode(),
            "key": key.hex(),
            "rank": rank,
            "shape": [list(self.shape.labels), list(self.shape.sizes)],
            "controller_pid": os.getpid(),
            "mesh": self.name,
        }
        assert popen.stdin is not None
        popen.stdin.write(json.dumps(bootstrap).encode() + b"\n")
        popen.stdin.close()
        return WorkerProcess(rank, identity, popen)

    def _register_peers(self, identities: list[bytes]) -> None:
        for rank, identity in enumerate(identities):
            self.controller.add_peer(identity, self, rank)

    def _watch(self, workers: list[WorkerProcess]) -> None:
        self.workers = workers
        loop = self.controller.loop
        for w in workers:
            loop.add_fd(w.pidfd, lambda w=w: self._on_exit(w))
            for name, pipe in (("stdout", w.popen.stdout), ("stderr", w.popen.stderr)):
                assert pipe is not None
                os.set_blocking(pipe.fileno(), False)
                loop.add_fd(pipe.fileno(), lambda w=w, n=name, p=pipe: self._on_output(w, n, p))

    # -- I/O thread -----------------------------------------------------------------

    def identity(self, rank: int) -> bytes:
        return self.workers[rank].identity

    def failure_for(self, ranks: tuple[int, ...]) -> MeshFailure | None:
        match self.state:
            case Failed(error):
                return error
            case Stopped():
                return MeshFailure(
                    f"process mesh {self.name!r} was stopped; start a new one or call restart()",
                    ranks=ranks,
                )
        return None

    def on_worker_message(self, rank: int, meta: tuple, frames: list[Any]) -> None:
        kind = meta[0]
        if kind == "hello":
            self.ready_ranks.add(rank)
            if len(self.ready_ranks) == len(self.shape) and isinstance(self.state, Starting):
                self.state = Running()
                self._all_ready.set()
        elif kind == "broadcast_failure":
            _, actor_id, label, failure = meta
            actor, _, endpoint = label.partition(".")
            error = RemoteError([failure], actor=actor, endpoint=endpoint)
            self.actor_failures[actor_id] = MeshFailure(
                f"broadcast of {label} failed on rank {rank}, so this actor mesh is failed; "
                f"spawn it again: {error}",
                ranks=(rank,),
                cause=error,
            )
            _log.error("monarch_nb: %s", self.actor_failures[actor_id])
            self._notify("actor_failed", self.actor_failures[actor_id])
        elif kind == "event":
            try:
                detail = decode_payload(frames)
            except Exception as exc:
                detail = exc
            self._notify(meta[1], (rank, detail))
        elif kind == "supervision":
            _, message = meta
            self.fail(
                MeshFailure(
                    f"rank {rank} of {self.name!r} reported an unhandled failure: {message}",
                    ranks=(rank,),
                    cause=message,
                )
            )

    def _on_output(self, worker: WorkerProcess, stream: str, pipe: Any) -> None:
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.controller.loop.remove_fd(pipe.fileno())
            if worker.partial[stream]:
                self._emit(worker, stream, worker.partial[stream])
                worker.partial[stream] = b""
            return
        data = worker.partial[stream] + chunk
        *lines, partial = data.split(b"\n")
        for line in lines:
            self._emit(worker, stream, line.rsplit(b"\r", 1)[-1] if b"\r" in line[:-1] else line)
        # Progress bars rewrite one line with "\r": pass each update on live.
        *updates, worker.partial[stream] = partial.split(b"\r")
        for update in updates:
            if update:
                self._emit(worker, stream, update, end="\r")

    def _emit(self, worker: WorkerProcess, stream: str, raw: bytes, end: str = "\n") -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        if stream == "stderr" and end == "\n":
            worker.stderr_tail.append(line)
        output = WorkerOutput(worker.rank, stream, line, self.name, end)
        try:
            self.controller.output_handler(output)
        except Exception:
            _log.exception("monarch_nb: the output handler failed")

    def _drain(self, worker: WorkerProcess) -> None:
        for name, pipe in (("stdout", worker.popen.stdout), ("stderr", worker.popen.stderr)):
            if pipe is not None and not pipe.closed:
                for _ in range(64):  # bounded: a grandchild could hold the pipe open
                    before = worker.partial[name]
                    self._on_output(worker, name, pipe)
                    if worker.partial[name] == before:
                        break

    def _on_exit(self, worker: WorkerProcess) -> None:
        self.controller.loop.remove_fd(worker.pidfd)
        os.close(worker.pidfd)
        worker.pidfd = -1
        worker.returncode = worker.popen.wait()
        self._drain(worker)
        self._notify("worker_exited", worker)
        if isinstance(self.state, Stopped | Failed) or worker.identity not in self._identities():
            return
        running = self.controller.calls_waiting_on(self, worker.rank)
        what = f" while running {', '.join(running)}" if running else ""
        if worker.rank in self.ready_ranks:
            consequence = "the mesh is failed: call restart() to start fresh processes"
        else:
            consequence = "so the mesh failed to start"
            if worker.stderr_tail:
                consequence += "; last lines of its stderr:\n  " + "\n  ".join(worker.stderr_tail)
        self.fail(
            MeshFailure(
                f"rank {worker.rank} (pid {worker.pid}) of process mesh {self.name!r} "
                f"{describe_exit(worker.returncode)}{what}; {consequence}",
                ranks=(worker.rank,),
                cause=worker.returncode,
            )
        )

    def _identities(self) -> set[bytes]:
        return {w.identity for w in self.workers}

    def fail(self, error: MeshFailure) -> None:
        """Mark the group failed and fail every call in flight to it (I/O thread)."""
        if isinstance(self.state, Failed | Stopped):
            return
        failed_calls = self.controller.end_group(self, Failed(error), error)
        self._all_ready.set()
        if not failed_calls:
            _log.warning("monarch_nb: %s", error)  # nobody was waiting: say it here
        self._notify("mesh_failed", error)
        _context.report_child_failure(self.owner, error)

    # -- stopping ---------------------------------------------------------------------

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Ask every worker to exit, kill what is left after ``grace`` s (blocking)."""
        if isinstance(self.state, Stopped):
            return
        workers = self.workers
        message = self.signer.encode(("shutdown",))
        live = tuple(w.rank for w in workers if w.returncode is None)

        self.controller.send(self, live, message, even_if_failed=True)
        self.controller.end_group(
            self,
            Stopped(),
            MeshFailure(f"process mesh {self.name!r} was stopped", ranks=self.shape.ranks),
        )
        deadline = time.monotonic() + grace
        for w in workers:
            try:
                w.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.popen.kill()
                w.popen.wait()
        self._forget(workers)

    def kill(self) -> None:
        """Kill every worker at once (no grace), e.g. before a restart."""

        if not isinstance(self.state, Stopped):
            self.controller.end_group(
                self,
                Stopped(),
                MeshFailure(f"process mesh {self.name!r} was killed", ranks=self.shape.ranks),
            )
        for w in self.workers:
            if w.popen.poll() is None:
                w.popen.kill()
        for w in self.workers:
            w.popen.wait()
        self._forget(self.workers)

    def _forget(self, workers: list[WorkerProcess]) -> None:
        def forget() -> None:
            for w in workers:
                self.controller.remove_peer(w.identity)
                if w.pidfd >= 0:
                    self.controller.loop.remove_fd(w.pidfd)
                    os.close(w.pidfd)
                    w.pidfd = -1
                for pipe in (w.popen.stdout, w.popen.stderr):
                    if pipe is not None and not pipe.closed:
                        self._drain(w)
                        self.controller.loop.remove_fd(pipe.fileno())
                        pipe.close()

        self.controller.run(forget)

    def restart(self) -> None:
        """Replace every process with a fresh one (actors must be spawned again)."""
        self.kill()
        self.start()

    # -- observation ------------------------------------------------------------------

    def add_listener(self, listener: Callable[[str, Any], None]) -> None:
        self._listeners.append(listener)

    def _notify(self, event: str, detail: Any) -> None:
        for listener in self._listeners:
            try:
                listener(event, detail)
            except Exception:
                _log.exception("monarch_nb: an event listener failed")


def check_gpus(count: int) -> None:
    available = len(visible_gpus())
    if count > available:
        raise MeshUsageError(
            f"per_host={{'gpus': {count}}} needs {count} GPUs but this host has {available} "
            "visible; ask for fewer, or use {'procs': N} for CPU ranks"
        )
