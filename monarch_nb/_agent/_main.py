"""A host agent: starts and watches one host's workers, and relays their messages.

One agent runs on each host of a multi-host mesh (``python -m monarch_nb.agent``,
or ``monarch-nb agent``). It is a single thread around one ``zmq.Poller``:

- **up**, a DEALER to the controller, CURVE-encrypted: the controller's casts
  arrive once per host with an envelope naming the local workers to relay them
  to (frame ``R`` + identities), or as the agent's own messages (frame ``A``,
  signed with the host mesh's agent key);
- **down**, a ROUTER on 127.0.0.1 that this host's workers connect to; what
  they send goes up unchanged (it is signed with their mesh's key, which the
  agent does not need to check: the controller does);
- a pidfd per worker (an exit is reported the instant it happens, with its code
  or signal) and its stdout/stderr pipes, forwarded as raw chunks;
- stdin (a launched agent): end of file means the launcher's channel is gone
  (the ssh connection dropped, srun ended), so the agent stops.

Liveness both ways: the agent sends a heartbeat every period, and when it
hears nothing from the controller for ``timeout_s`` it kills its workers (a
launched agent then exits; an attached one waits for the next controller).
Workers die with the agent (parent-death signal), so no rank outlives it.

A listening agent with no controller attached has no workers (they are killed
when the controller leaves) and waits for the next one, but not forever: after
``agent_idle_timeout`` seconds without one (the setting, read at start; 0:
never) it exits, and removes its key file when a job made it for this agent
(``job-<hex>.key``, ``agent-job-<hex>.key``; a file made with ``monarch-nb
keygen`` is the user's and stays). A job nobody re-attaches ends by itself.

Two ways to start:

``launched``  (ssh, SLURM) the bootstrap arrives as one JSON line on stdin:
              the controller's address and CURVE public key, this agent's
              CURVE key pair and agent key. Never on a command line.
``listen``    (``--listen tcp://0.0.0.0:PORT --key-file F``, for agents started
              by other tools, e.g. Kubernetes): the agent binds, and a
              controller calling ``attach()`` connects with the keys from the
              same key file (readable by its owner only).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from .._model._errors import MeshUsageError
from .._services import _config, _logs
from .._services._descendants import kill_tree
from .._services._spawn import kill_leftovers, start_worker
from .._wire import _keys, _network, _rundir
from .._wire._fd_limits import ExhaustionWarning, exhausted, raise_fd_limit
from .._wire._handshake_guard import HandshakeGuard
from .._wire._messages import (
    AgentAttach,
    AgentHeartbeat,
    AgentHello,
    AgentShutdown,
    AgentSuperseded,
    KillWorkers,
    LaunchWorkers,
    LogLines,
    Message,
    PySpyRequest,
    ReadLogs,
    SyncWorkspace,
    UnknownMessage,
    WorkerExited,
    WorkerOutput,
    WorkerStarted,
)
from .._wire._signed import (
    CONTROLLER,
    MAX_FRAME_BYTES,
    OWN,
    RELAY,
    ReplayWindow,
    Signer,
    WireStats,
    forward,
    receive,
    sender_tag,
)
from .._wire._tree import TREE, TreeListen
from .._wire._tree_fold import FOLD
from ._background import BackgroundRequests
from ._folds import Folds
from ._tree import TreeRelay

_log = logging.getLogger("monarch_nb.agent")
_CHUNK = 65536
# 0: a send to a controller that is not there fails at once (zmq.Again), and the
# message is dropped (nobody is there to take it). Waiting instead, even briefly,
# let the workers' heartbeats keep the loop sending, never noticing the silence.
_SEND_TIMEOUT_MS = 0
# Key files a job writes for its agents (_jobs._job): removed when an idle
# agent exits. Any other key file is the user's own, and stays.
_JOB_KEY_FILE = re.compile(r"(agent-)?job-[0-9a-f]{12}\.key")


def _own_address(config: dict[str, Any]) -> str:
    """Where the other hosts reach this one: the address it reaches the controller
    from; behind ``ssh -R`` (``reverse``) that is loopback, so the address ssh
    reached this host at (``SSH_CONNECTION``), else the default route's."""
    if not config.get("reverse"):
        return _network.source_address_towards(config["controller"])
    fields = os.environ.get("SSH_CONNECTION", "").split()
    return fields[2] if len(fields) == 4 else _network.default_address()


@dataclass
class _Child:
    identity: bytes
    popen: subprocess.Popen[bytes]
    pidfd: int
    pipes: dict[int, str] = field(default_factory=dict)  # fd -> "stdout" / "stderr"


class Agent:
    """One host's agent (see the module docstring)."""

    def __init__(self, config: dict[str, Any], *, listen: str | None = None) -> None:
        self.config = config
        self.host_index = int(config.get("host_index", 0))
        self.heartbeat_s = float(config.get("heartbeat_s", 1.0))
        self.timeout_s = float(config.get("timeout_s", 5.0))
        self.listen = listen
        # A listening agent exits after this long with no controller (0: never).
        self.idle_timeout_s = float(config.get("idle_timeout_s", 0.0))
        self.key_file: str | None = config.get("key_file")
        # Behind ssh -R to Unix sockets (reverse): what to dial for the controller's
        # loopback addresses; the workers are told too (MONARCH_NB_TUNNELS).
        self.tunnels: dict[str, str] = dict(config.get("tunnels") or {})
        self.idle_since = time.monotonic()
        # An attached agent learns the identity it seals with from AgentAttach.
        identity = config.get("identity", "").encode()
        self.signer = Signer(
            bytes.fromhex(config["key"]),
            WireStats(),
            sender=sender_tag(identity),
            upstream=True,
            trusted_link=True,  # up is CURVE, down our private Unix socket
        )
        self.window = ReplayWindow()
        self.context = zmq.Context()
        self.poller = zmq.Poller()
        self.children: dict[bytes, _Child] = {}
        self._fd_owner: dict[int, _Child] = {}
        self.stopping = False
        self.last_heard = time.monotonic()
        # Out of fds (a connection flood): the request that needed one fails, said once.
        self.fd_warning = ExhaustionWarning(_log, f"agent {self.host_index}")
        self._last_free_port = 0
        self.guard: HandshakeGuard | None = None  # on a listening endpoint only
        self.connected = listen is None  # an attached agent waits for a controller
        # A listening agent serves one controller, the one that attached last: its
        # connection's routing id here. Others (an older controller that comes
        # back) are told they were superseded, once each, and not served.
        self.peer: bytes | None = None
        self._told_superseded: set[bytes] = set()
        # The workers' side: a Unix socket in this agent's private (0700) run
        # directory, so no other user of the host can reach it at all; and what
        # comes from anyone but a worker we started is dropped (counted), never
        # relayed up the controller's link.
        self.down = self._socket(zmq.ROUTER)
        self.down.bind(_rundir.socket_path(f"agent-{secrets.token_hex(8)}"))
        self.down_address = self.down.getsockopt_string(zmq.LAST_ENDPOINT)
        self.dropped_from_strangers = 0
        self.up = self._open_up()
        self.poller.register(self.up, zmq.POLLIN)
        if self.guard is not None:
            self.poller.register(self.guard.monitor, zmq.POLLIN)
        self.poller.register(self.down, zmq.POLLIN)
        # py-spy runs and workspace unpacks take seconds: threads, whose replies
        # this loop (the one owner of the sockets) sends when woken.
        self.background = BackgroundRequests(self.fd_warning)
        self.poller.register(self.background.wake_fd, zmq.POLLIN)
        self.tree = TreeRelay(self.context, self.poller, config["curve"])  # casts to relay on
        self.folds = self.tree.folds = Folds(self.send_own, self.tree.send_to_parent)

    # -- sockets ------------------------------------------------------------------

    def _socket(self, kind: int) -> zmq.Socket:
        """No lingering at exit and no high-water mark: the agent relays, it never
        decides to drop (the controller and the workers bound what is in flight)."""
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        return sock

    def _open_up(self) -> zmq.Socket:
        # Launched, a DEALER that connects to its one controller; listening, a
        # ROUTER, which knows which connected controller each message came from
        # (a bound DEALER would deal our messages out among them in turn).
        up = self._socket(zmq.DEALER if self.listen is None else zmq.ROUTER)
        up.setsockopt(zmq.HEARTBEAT_IVL, 1000)  # notice a dead TCP peer at the zmq level too
        # Never block on a controller that may be gone (a bound DEALER with no peer
        # blocks every send): the loop goes on to notice the silence, kill the
        # workers, and answer SIGTERM.
        up.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
        # Whatever reaches this socket from the network before CURVE has judged it
        # is bounded by this size, not by an attacker.
        up.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        up.setsockopt(zmq.HANDSHAKE_IVL, 10_000)
        keys = self.config["curve"]
        if self.listen is None:
            up.setsockopt(zmq.ROUTING_ID, self.config["identity"].encode())
            up.curve_serverkey = keys["server_public"].encode()
            up.curve_publickey = keys["client_public"].encode()
            up.curve_secretkey = keys["client_secret"].encode()
            controller = self.config["controller"]
            up.connect(self.tunnels.get(controller, controller))
        else:
            _keys.allow_only(self.context, keys["client_public"])
            # Anyone can open connections here: those still in their handshake
            # are capped, and dropped after a few seconds (HANDSHAKE_IVL).
            self.guard = HandshakeGuard(up, logger=_log, who=f"agent {self.host_index}")
            up.curve_server = True
            up.curve_publickey = keys["server_public"].encode()
            up.curve_secretkey = keys["server_secret"].encode()
            if self.config.get("listen_fd") is not None:  # a socket it was handed, bound
                up.setsockopt(zmq.USE_FD, self.config["listen_fd"])
            up.bind(self.listen)
        return up

    def send_own(self, message: Message, to: bytes | None = None) -> None:
        """Send ``message`` to the controller (listening: to ``to``, by default the
        one attached now; none attached, nowhere)."""
        if self.listen is not None:
            to = to if to is not None else self.peer
            if to is None:
                return
        try:
            self.signer.encode(message).send(self.up, identity=to, envelope=OWN)
        except zmq.Again:
            pass  # no controller to take it: the silence check ends this session

    def hello(self, address: str) -> None:
        self.address = address
        self.send_own(
            AgentHello(
                self.host_index,
                socket.gethostname(),
                address,
                os.getpid(),
                self._free_port(),
                len(_network.visible_gpus()),
            )
        )

    def _free_port(self) -> int:
        """A port free on this host now (for MASTER_PORT); out of fds to look with,
        the last one found (0 before any: the controller keeps its own last)."""
        try:
            self._last_free_port = _network.free_port()
        except OSError as exc:
            if not exhausted(exc):
                raise
            self.fd_warning.failed("looking for a free port (MASTER_PORT)", exc)
        return self._last_free_port

    # -- the loop -----------------------------------------------------------------

    def run(self) -> None:
        if self.listen is None:
            self.hello(_own_address(self.config))
        if self.config.get("watch_stdin"):
            self.poller.register(sys.stdin.fileno(), zmq.POLLIN)
        next_beat = time.monotonic() + self.heartbeat_s
        while not self.stopping:
            timeout = max(0.0, next_beat - time.monotonic())
            try:
                self._poll_once(timeout)
            except OSError as exc:
                # What needed a new fd failed (each request that may catches it
                # itself and says what); the agent and its workers go on.
                if not exhausted(exc):
                    raise
                self.fd_warning.failed("handling a message", exc)
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self.heartbeat_s
                if self.connected:
                    self.send_own(AgentHeartbeat(self._free_port()))
            if self.connected and now - self.last_heard > self.timeout_s:
                self._controller_gone(now - self.last_heard)
            elif not self.connected and 0 < self.idle_timeout_s < now - self.idle_since:
                self._idle_exit(now - self.idle_since)
        self.kill_all()
        self.tree.close()
        self.context.destroy(linger=0)
        for dialed in self.tunnels.values():  # our ssh's sockets: gone with it
            with contextlib.suppress(OSError):
                os.unlink(dialed.removeprefix("ipc://"))

    def _poll_once(self, timeout: float) -> None:
        for item, _ in self.poller.poll(int(timeout * 1000) + 1):
            if item is self.up:
                self._from_controller()
            elif item is self.down:
                self._from_workers()
            elif self.tree.owns(item):
                self.tree.readable(item, self.down)
            elif self.guard is not None and item is self.guard.monitor:
                self.guard.readable()
            elif item == self.background.wake_fd:
                for reply in self.background.replies():
                    self.send_own(reply)
            elif item == sys.stdin.fileno() and self.config.get("watch_stdin"):
                if not os.read(item, 4096):
                    _log.info("agent %d: launcher channel closed; stopping", self.host_index)
                    self.stopping = True
            else:
                self._on_fd(item)

    def _controller_gone(self, silent_for: float) -> None:
        _log.warning(
            "agent %d: nothing from the controller for %.1f s; killing %d workers",
            self.host_index,
            silent_for,
            len(self.children),
        )
        self._disconnect()

    def _disconnect(self) -> None:
        """This controller is done: a launched agent exits, an attached one waits for
        the next (whose sequence numbers start afresh)."""
        self.kill_all()
        self.tree.close()  # the next controller opens it again if it builds a tree
        self.folds.clear()
        if self.listen is None:
            self.stopping = True
        else:
            self.connected = False
            self.peer = None
            self.idle_since = time.monotonic()
            self.window = ReplayWindow()

    def _idle_exit(self, idle_for: float) -> None:
        """No controller for ``agent_idle_timeout``: stop, with no worker left (any
        that a controller started without attaching is killed as the loop ends)
        and the job's key file removed."""
        _log.warning(
            "agent %d: no controller attached for %.0f s (agent_idle_timeout %g s); exiting",
            self.host_index,
            idle_for,
            self.idle_timeout_s,
        )
        self.stopping = True
        key_file = self.key_file
        if key_file and _JOB_KEY_FILE.fullmatch(os.path.basename(key_file)):
            try:
                os.unlink(key_file)  # a link there is removed itself, its target never
            except FileNotFoundError:
                pass  # another agent of the job removed it first
            except OSError as exc:
                _log.warning("agent %d: could not remove %s: %s", self.host_index, key_file, exc)

    # -- messages -------------------------------------------------------------------

    def _from_controller(self) -> None:
        while True:
            frames = receive(self.up, self.signer.stats)
            if frames is None:
                return
            peer = None
            if self.listen is not None:  # a ROUTER: first, which connection it came on
                peer, frames = frames[0].bytes, frames[1:]
                if peer != self.peer:
                    self._from_another_controller(peer, frames)
                    continue
            envelope = frames[0].bytes
            if envelope.startswith(RELAY):
                body = frames[1:]
                for identity in envelope[1:].split(b"\n"):
                    forward(self.down, body, identity)
                self.last_heard = time.monotonic()
            elif envelope.startswith(TREE):  # to its workers and on down the tree
                self.tree.relay(frames[0].buffer[1:], frames[1:], self.down)
                self.last_heard = time.monotonic()
            elif envelope.startswith(FOLD):  # the same, its replies folded here (_folds)
                self.tree.fold(frames[0].buffer[1:], frames[1:], self.down, None)
                self.last_heard = time.monotonic()
            elif envelope == OWN:
                try:
                    message = self.signer.verify(frames[1:], self.window, sender=CONTROLLER)
                except UnknownMessage as exc:
                    _log.error("agent %d: %s", self.host_index, exc)
                    continue
                if message is not None:
                    self.last_heard = time.monotonic()
                    self._handle(message)

    def _from_another_controller(self, peer: bytes, frames: list[Any]) -> None:
        """A message from a controller other than the one served now (listening).
        A verified attach makes it the one served (the newest wins); anything else
        is not acted on, and its sender is told, once, that it was superseded."""
        if not frames or frames[0].bytes != OWN:
            message = None  # a relay: only the controller served may relay
        else:
            try:
                # Its own window: the served controller's sequence numbers are apart.
                message = self.signer.verify(frames[1:], ReplayWindow(), sender=CONTROLLER)
            except UnknownMessage:
                return
            if message is None:
                return  # not signed with the job's key: nothing to answer
        if isinstance(message, AgentAttach):
            previous = self.peer
            self.peer = peer
            self.window = ReplayWindow()
            self._told_superseded.discard(peer)
            if previous is not None:
                self._tell_superseded(previous)
            self.last_heard = time.monotonic()
            self._handle(message)
            return
        if message is not None or frames[0].bytes.startswith(RELAY):
            self._tell_superseded(peer)

    def _tell_superseded(self, peer: bytes) -> None:
        if peer in self._told_superseded:
            return
        self._told_superseded.add(peer)
        _log.warning(
            "agent %d: a controller that another one replaced is still sending; telling it",
            self.host_index,
        )
        self.send_own(AgentSuperseded(socket.gethostname(), os.getpid()), to=peer)

    def _handle(self, message: Message) -> None:
        match message:
            case AgentHeartbeat():
                pass
            case AgentAttach(address, identity, host_index):
                if self.connected:  # one controller at a time: the newest one
                    _log.warning(
                        "agent %d: a new controller attached; ending the previous "
                        "session (%d workers)",
                        self.host_index,
                        len(self.children),
                    )
                    self.kill_all()
                self.connected = True
                self.host_index = host_index  # its place in this controller's mesh
                self.signer.sender = sender_tag(identity.encode())
                self.hello(address)
            case LaunchWorkers(workers):
                for identity, env, bootstrap in workers:
                    self._launch(identity, env, bootstrap)
            case KillWorkers(identities):
                for identity in identities:
                    child = self.children.get(identity.encode())
                    if child is not None and child.popen.poll() is None:
                        kill_tree(child.popen.pid)  # what it started too, in any session
            case AgentShutdown():
                self._disconnect()
            case ReadLogs():
                self.send_own(read_logs(message))
            case PySpyRequest():
                child = self.children.get(message.identity.encode())
                self.background.run_py_spy(message, None if child is None else child.popen.pid)
            case SyncWorkspace():
                self.background.sync_workspace(message)
            case TreeListen():
                self.send_own(self.tree.listen(self.address, f"agent {self.host_index}'s tree"))
            case _:
                _log.error("agent %d: unexpected %s", self.host_index, type(message).__name__)

    def _from_workers(self) -> None:
        while True:
            frames = receive(self.down, self.signer.stats)
            if frames is None:
                return
            child = self.children.get(frames[0].bytes)
            if child is None:
                self.dropped_from_strangers += 1  # not a worker of ours: never relayed
                continue
            # What it printed before this reply goes first.
            for fd in list(child.pipes):
                while fd in self._fd_owner and self._read_pipe(child, fd, drain=True):
                    pass
            if self.listen is not None and self.peer is None:
                continue  # no controller attached: its replies have nowhere to go
            if self.folds.waiting and self.folds.from_worker(child.identity, frames[1:]):
                continue  # a reply to a reduced call, folded here
            try:
                forward(self.up, frames, self.peer)
            except zmq.Again:
                pass  # the controller is gone: the silence check ends this session

    # -- workers ----------------------------------------------------------------------

    def _launch(self, identity: str, env: dict[str, str], bootstrap: dict[str, Any]) -> None:
        try:
            popen = self._start(env, bootstrap)
        except OSError as exc:
            # No fd for its pipes (a flood), no memory to fork: this worker fails
            # to start, and says why; the agent and the other workers go on.
            self._not_started(identity, "start", exc)
            return
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError as exc:
            popen.kill()
            popen.wait()
            kill_leftovers(popen.pid)
            for pipe in (popen.stdout, popen.stderr):
                if pipe is not None:
                    pipe.close()
            self._not_started(identity, "watch", exc)
            return
        child = _Child(identity.encode(), popen, pidfd)
        self.children[child.identity] = child
        self._fd_owner[child.pidfd] = child
        self.poller.register(child.pidfd, zmq.POLLIN)
        for name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            child.pipes[pipe.fileno()] = name
            self._fd_owner[pipe.fileno()] = child
            self.poller.register(pipe.fileno(), zmq.POLLIN)
        self.send_own(WorkerStarted(identity, popen.pid))
        self.folds.watch(child.identity, bootstrap.get("key"))

    def _not_started(self, identity: str, verb: str, exc: OSError) -> None:
        """Worker ``identity`` failed to start: its stderr says why, and it exited."""
        if exhausted(exc):
            self.fd_warning.failed(f"{verb}ing worker {identity}", exc)
        why = f"monarch_nb agent: could not {verb} this worker: {type(exc).__name__}: {exc}\n"
        self.send_own(WorkerOutput(identity, "stderr", why.encode()))
        self.send_own(WorkerExited(identity, 1))

    def _start(self, env: dict[str, str], bootstrap: dict[str, Any]) -> subprocess.Popen[bytes]:
        """A worker's process, its environment made from this host's (raises OSError)."""
        full_env = dict(os.environ)
        full_env.update(_network.worker_env(self.address, env))
        if self.config.get("reverse"):  # the controller is on our loopback (ssh -R)
            full_env["MONARCH_NB_REVERSE_TUNNEL"] = "1"
            if self.tunnels:
                full_env["MONARCH_NB_TUNNELS"] = json.dumps(self.tunnels)
        full_env[_rundir.TREE_ROOT_ENV] = str(os.getpid())  # this host's tree is ours
        if self.background.workspaces:  # synced here: importable by the workers
            paths = [*self.background.workspaces, full_env.get("PYTHONPATH", "")]
            full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        local_gpu = full_env.pop("MONARCH_NB_LOCAL_GPU", None)
        if local_gpu is not None:  # this host's GPUs, as this host's agent sees them
            full_env["CUDA_VISIBLE_DEVICES"] = _network.visible_gpus()[int(local_gpu)]
        boot = dict(bootstrap, address=self.down_address, controller_pid=os.getpid())
        return start_worker(full_env, boot)

    def _on_fd(self, fd: int) -> None:
        child = self._fd_owner.get(fd)
        if child is None:
            return
        if fd == child.pidfd:
            self._on_exit(child)
        else:
            self._read_pipe(child, fd)

    def _read_pipe(self, child: _Child, fd: int, drain: bool = False) -> bool:
        """Forward what the pipe has; False once it reached end of file (or, when
        ``drain``ing, once nothing is left to read now)."""
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return not drain
        except OSError:
            data = b""
        if not data:
            self.poller.unregister(fd)
            self._fd_owner.pop(fd, None)
            return False
        self.send_own(WorkerOutput(child.identity.decode(), child.pipes[fd], data))
        return True

    def _on_exit(self, child: _Child) -> None:
        self.poller.unregister(child.pidfd)
        self._fd_owner.pop(child.pidfd, None)
        os.close(child.pidfd)
        returncode = child.popen.wait()
        kill_leftovers(child.popen.pid)
        for fd in list(child.pipes):  # its last words first
            for _ in range(64):
                if fd not in self._fd_owner or not self._read_pipe(child, fd):
                    break
        for fd in child.pipes:
            if fd in self._fd_owner:
                self.poller.unregister(fd)
                self._fd_owner.pop(fd, None)
        for pipe in (child.popen.stdout, child.popen.stderr):
            if pipe is not None:
                pipe.close()
        del self.children[child.identity]
        self.send_own(WorkerExited(child.identity.decode(), returncode))
        self.folds.forget(child.identity)

    def kill_all(self) -> None:
        children = list(self.children.values())
        for child in children:
            if child.popen.poll() is None:
                kill_tree(child.popen.pid)
        for child in children:
            child.popen.wait()
            if child.identity in self.children:
                self._on_exit(child)


def read_logs(request: ReadLogs) -> LogLines:
    """This host's answer to ``procs.logs()``: the matching lines of its ranks' files."""
    try:
        since = None
        if request.since is not None:
            since = dt.datetime.fromtimestamp(request.since).astimezone()
        found = _logs.read(
            request.mesh,
            request.ranks,
            grep=request.grep,
            since=since,
            level=request.level,
            tail=request.tail,
            root=request.root or None,
        )
    except Exception as exc:  # an unreadable file: said to the caller, the agent goes on
        return LogLines(request.request_id, (), f"{type(exc).__name__}: {exc}")
    lines = tuple((line.rank, line.time.isoformat(), line.stream, line.text) for line in found)
    return LogLines(request.request_id, lines, "")


def _read_launched_config() -> dict[str, Any]:
    line = sys.stdin.buffer.readline()
    if not line:
        raise SystemExit("monarch_nb agent: no bootstrap on stdin (start it with a launcher)")
    config = json.loads(line)
    if config.get("host_index") is None:  # SLURM: one bootstrap for all, index by node
        node = os.environ.get("SLURM_NODEID", os.environ.get("SLURM_PROCID", "0"))
        config["host_index"] = int(node)
        config["identity"] = f"{config['identity']}{config['host_index']}"
    config["watch_stdin"] = config.get("watch_stdin", True)
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="monarch-nb agent",
        description="Run this host's monarch_nb agent. Started by ssh_hosts()/slurm_hosts() "
        "with its keys on stdin, or by any tool with --listen and --key-file for attach().",
    )
    parser.add_argument("--listen", help="bind here and wait for attach(), e.g. tcp://0.0.0.0:7000")
    parser.add_argument("--key-file", help="keys shared with the controller (monarch-nb keygen)")
    # Only a label in logs: each attach tells the agent its place in that mesh.
    parser.add_argument("--host-index", type=int, default=0, help="a label until attached")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    raise_fd_limit()  # a listening endpoint holds an fd per connection, keyed or not
    # SIGTERM from a launcher (scancel, an ssh hang-up) ends the agent cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(0))
    if args.listen:
        if not args.key_file:
            parser.error("--listen needs --key-file (make one with: monarch-nb keygen FILE)")
        try:
            config = _keys.agent_config_from_file(args.key_file)
        except (PermissionError, ValueError) as exc:
            # The message already says what is wrong and what to run; no traceback.
            parser.exit(2, f"monarch_nb agent: {exc}\n")
        config["host_index"] = args.host_index
        config["key_file"] = args.key_file
        try:
            config["idle_timeout_s"] = _config.get("agent_idle_timeout")
        except MeshUsageError as exc:  # names the variable, its value, and what to give
            parser.exit(2, f"monarch_nb agent: {exc}\n")
        agent = Agent(config, listen=args.listen)
    else:
        agent = Agent(_read_launched_config())
    try:
        agent.run()
    finally:
        agent.kill_all()
