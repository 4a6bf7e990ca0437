"""The hosts of a multi-host mesh, as the controller sees them: one agent each.

A :class:`HostAgents` is the controller's side of one host mesh: the agents
(one :class:`AgentLink` per host), their keys, the launcher processes that
started them (ssh clients, an srun), and the workers they run for each
process mesh (:class:`RemoteWorker`). Everything here runs on the I/O thread
unless a method says otherwise.

The link to each agent is CURVE-encrypted, and the agent's own messages are
signed with the host mesh's agent key; workers' messages pass through the
agent signed with their own mesh's key, and the controller checks both.

Liveness: the controller and every agent send each other a heartbeat every
``heartbeat_s``; an agent not heard from for ``timeout_s`` (or whose launcher
process ended) is *lost*, and every rank it ran fails at once, named, as one
failure of that host. An agent that hears nothing from the controller for as
long kills its workers (see :mod:`monarch_nb._agent._main`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import os
import secrets
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._model._errors import CallTimeout, MeshFailure, MeshUsageError
from .._model._fold import format_ranks
from .._model._future import Future
from .._services import _py_spy
from .._wire import _keys, _network
from .._wire._messages import (
    AgentHeartbeat,
    AgentHello,
    AgentShutdown,
    AgentSuperseded,
    KillWorkers,
    LaunchWorkers,
    LogLines,
    Message,
    PySpyReply,
    PySpyRequest,
    ReadLogs,
    SyncWorkspace,
    UnknownMessage,
    WorkerExited,
    WorkerOutput,
    WorkerStarted,
    WorkspaceSynced,
)
from .._wire._signed import CONTROLLER, ReplayWindow, Signer, sender_tag
from .._wire._tree import TreeListening
from .._wire._tree_fold import FoldedReply
from ._agent_tree import AgentTree
from ._client import Controller
from ._tree_reduce import on_folded
from ._workers import HEARTBEAT_S, START_TIMEOUT_S, WorkerProcess

if TYPE_CHECKING:
    from ._group_protocol import HostedGroup

_log = logging.getLogger("monarch_nb")
_host_mesh_ids = itertools.count(1)
_py_spy_request_ids = itertools.count(1)
_PY_SPY_RELAY_S = 10.0  # beyond py-spy's own time limit: the trip to the agent and back
HOST_TIMEOUT_S = float(os.environ.get("MONARCH_NB_HOST_TIMEOUT", "5.0"))
_LAUNCHER_TAIL_LINES = 20
# Variables the controller's environment passes on to remote workers: our own
# settings, so a host behaves as the controller's does.
_FORWARDED_PREFIX = "MONARCH_NB_"


class RemoteWorker(WorkerProcess):
    """A worker a host agent started; killed and reaped through the agent."""

    def __init__(self, rank: int, identity: bytes, agent: AgentLink) -> None:
        super().__init__(rank, identity, 0, agent.label)
        self.agent = agent
        self.exited = threading.Event()

    @property
    def route(self) -> bytes:
        return self.agent.identity

    def kill(self) -> None:
        if self.returncode is None and self.agent.lost is None:
            self.agent.hosts.send(self.agent, KillWorkers((self.identity.decode(),)))

    def wait(self, timeout: float | None) -> bool:
        return self.exited.wait(timeout)

    def py_spy(self, **options: Any) -> _py_spy.Outcome:
        # Run by this host's agent; its answer comes back as a PySpyReply.
        timeout = options["timeout"]
        future: Future[_py_spy.Outcome] = Future._new()
        request_id = next(_py_spy_request_ids)
        self.agent.hosts.py_spy_requests[request_id] = future
        request = PySpyRequest(
            request_id,
            self.identity.decode(),
            options["mode"],
            options["native"],
            options.get("seconds", 0),
            options.get("fmt", "flamegraph"),
            options.get("rate", 100),
            timeout,
            options.get("full_filenames", False),
        )
        self.agent.hosts.send(self.agent, request)
        try:
            return future.get(timeout=timeout + _PY_SPY_RELAY_S)
        except TimeoutError:
            requests = self.agent.hosts.py_spy_requests
            for request_id, pending in list(requests.items()):
                if pending is future:
                    requests.pop(request_id, None)
            return _py_spy.Outcome(
                _py_spy.TIMED_OUT, "", f"no answer from the agent on {self.agent.label}"
            )


class LauncherProcess:
    """A process that started agents (an ssh client, srun), and its stderr tail."""

    def __init__(self, what: str, popen: subprocess.Popen[bytes]) -> None:
        self.what = what  # "ssh to node1", "srun"
        self.popen = popen
        self.stderr_tail: deque[str] = deque(maxlen=_LAUNCHER_TAIL_LINES)
        self.partial = b""

    def describe_end(self) -> str:
        code = self.popen.returncode
        said = "; it said:\n  " + "\n  ".join(self.stderr_tail) if self.stderr_tail else ""
        return f"{self.what} ended (exit code {code}){said}"


class AgentLink:
    """One host's agent: its identity, what it said in hello, liveness, workers."""

    def __init__(self, hosts: HostAgents, index: int, label: str) -> None:
        self.hosts = hosts
        self.index = index
        self.label = label  # the name the user gave (a host name, an address)
        self.named_by_agent = False  # srun chose the node: its hello names it
        self.identity = f"{hosts.identity_prefix}{index}".encode()
        self.tag = sender_tag(self.identity)
        self.hostname = ""
        self.address = ""
        self.pid = 0
        self.free_port = 0  # its latest report (hello, then each heartbeat): MASTER_PORT
        self.gpus = 0  # as the agent sees them
        self.window = ReplayWindow()
        self.ready = threading.Event()
        self.last_heard = time.monotonic()
        self.lost: str | None = None
        self.launcher: LauncherProcess | None = None
        self.connected_to: str | None = None  # the address we connected to (attach)
        self.workers: dict[bytes, tuple[HostedGroup, RemoteWorker]] = {}

    def on_message(self, frames: list[Any]) -> None:
        self.hosts.on_agent_message(self, frames)


class HostAgents:
    """The controller's side of one host mesh (see the module docstring)."""

    def __init__(
        self,
        controller: Controller,
        labels: Sequence[str],
        *,
        keys: dict[str, Any] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = HOST_TIMEOUT_S,
    ) -> None:
        if not labels:
            raise MeshUsageError("a host mesh needs at least one host")
        self.id = next(_host_mesh_ids)
        # Agents' routing ids: random (128 bits), so nobody who cannot read the
        # bootstrap can connect first under an agent's name. A predictable one let
        # a local user make libzmq abort the controller as it attached.
        self.identity_prefix = f"agent-{secrets.token_hex(16)}-"
        # ssh_hosts: how ssh reaches each host (by its label), for rsync
        self.ssh_command: list[str] | None = None
        self.controller = controller
        self.keys = keys or _keys.new_keys()
        # An agent that served an earlier controller (attach: the same key file)
        # keeps that session's replay window until it notices the silence. Numbers
        # from the clock start above any earlier session's, so it takes ours at
        # once, and still refuses the old session's messages replayed.
        self.signer = Signer(
            bytes.fromhex(self.keys["key"]),
            controller.stats,
            sender=CONTROLLER,
            upstream=False,
            trusted_link=True,  # CURVE: see _wire's docstring
            first_sequence=time.time_ns() // 1000,
        )
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.agents = [AgentLink(self, i, label) for i, label in enumerate(labels)]
        self.launchers: list[LauncherProcess] = []
        self.failure: str | None = None  # why starting failed, for waiters
        self.advice = (  # what to check, said after the failure (a refused key says its own)
            "\n(check that the launcher's command works by hand, e.g. ssh HOST python -m "
            "monarch_nb.agent --help, and that the hosts can reach this machine's address)"
        )
        self.endpoint = ""  # the controller's CURVE endpoint for them (not for attach)
        self.shut_down = False
        self._ports_given: set[int] = set()  # MASTER_PORTs handed to meshes
        # procs.logs() waiting for hosts: request id -> (its answer, the agent asked).
        self._log_reads: dict[int, tuple[concurrent.futures.Future[LogLines], AgentLink]] = {}
        self._log_read_ids = itertools.count(1)
        self._syncs: dict[int, tuple[concurrent.futures.Future[WorkspaceSynced], AgentLink]] = {}
        self.py_spy_requests: dict[int, Future[_py_spy.Outcome]] = {}
        self.tree = AgentTree(self)  # casts to many hosts go down it (_agent_tree)
        controller.host_meshes.add(self)
        for agent in self.agents:
            controller.agent_links.add(agent.identity, agent)

    # -- starting (caller thread unless said) -------------------------------------

    def bootstrap(self, endpoint: str, agent: AgentLink | None) -> dict[str, Any]:
        """What an agent reads on stdin: ``agent`` None for one bootstrap shared by
        every agent of an srun (each adds its SLURM node id)."""
        curve = self.keys["curve"]
        return {
            "controller": endpoint,
            "identity": agent.identity.decode() if agent else self.identity_prefix,
            "host_index": agent.index if agent else None,
            "key": self.keys["key"],
            "curve": {
                "server_public": curve["server_public"],
                "client_public": curve["client_public"],
                "client_secret": curve["client_secret"],
            },
            "heartbeat_s": self.heartbeat_s,
            "timeout_s": self.timeout_s,
        }

    def bind_host(self) -> str:
        """An address of this machine that the agents' hosts reach (where the
        controller's own actor inbox listens for them)."""
        if self.endpoint:
            return urlsplit(self.endpoint).hostname or "127.0.0.1"
        for agent in self.agents:  # attach: we connected to them; answer from that side
            if agent.address:
                return _network.source_address_towards(f"tcp://{agent.address}:9")
        return "127.0.0.1"

    def listen(self, bind_host: str) -> str:
        """Open the controller's CURVE endpoint for these agents; returns it."""
        curve = self.keys["curve"]
        _keys.allow_only(self.controller.loop.context, curve["client_public"])
        self.endpoint = self.controller.run(
            lambda: self.controller.agent_links.bind_curve(
                bind_host, curve["server_public"], curve["server_secret"]
            )
        )
        return self.endpoint

    def start_process(
        self, what: str, argv: list[str], stdin_lines: list[bytes], agents: list[AgentLink]
    ) -> None:
        """Run a launcher (``argv``) that starts ``agents``, writing their bootstrap
        to its stdin, which stays open: its end tells the agents to stop."""

        def launch() -> None:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C is for the controller
            )
            launcher = LauncherProcess(what, popen)
            self.launchers.append(launcher)
            for agent in agents:
                agent.launcher = launcher
            assert popen.stdin is not None
            assert popen.stderr is not None
            for line in stdin_lines:
                popen.stdin.write(line)
            popen.stdin.flush()
            loop = self.controller.loop
            pidfd = os.pidfd_open(popen.pid)
            loop.add_fd(pidfd, functools.partial(self._launcher_exited, launcher, pidfd))
            os.set_blocking(popen.stderr.fileno(), False)
            loop.add_fd(popen.stderr.fileno(), functools.partial(self._launcher_stderr, launcher))

        self.controller.run(launch)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Block until every agent said hello; raise, and stop the rest, if not."""
        deadline = time.monotonic() + timeout
        for agent in self.agents:
            while not agent.ready.wait(0.1):
                if self.failure is not None or time.monotonic() > deadline:
                    why = self.failure or (
                        f"the agent on {agent.label} did not report within {timeout:.0f} s"
                        + self._launcher_words(agent)
                    )
                    self.shutdown()
                    raise MeshFailure(f"could not start the host mesh: {why}{self.advice}")
        try:
            self.tree.start(timeout)
        except MeshFailure as exc:
            self.shutdown()
            raise MeshFailure(f"could not start the host mesh: {exc}") from None
        self.controller.run(lambda: self.controller.loop.call_later(self.heartbeat_s, self._tick))

    def _launcher_words(self, agent: AgentLink) -> str:
        launcher = agent.launcher
        if launcher is None or not launcher.stderr_tail:
            return ""
        return f"; {launcher.what} said:\n  " + "\n  ".join(launcher.stderr_tail)

    # -- process meshes on these hosts --------------------------------------------

    def route_of_rank(self, group: HostedGroup, rank: int) -> bytes:
        return self._agent_of_rank(group, rank).identity

    def _agent_of_rank(self, group: HostedGroup, rank: int) -> AgentLink:
        return self.agents[rank // (len(group.shape) // len(self.agents))]

    def launch(
        self, group: HostedGroup, identities: list[bytes], bootstrap: dict[str, Any]
    ) -> None:
        """Start ``group``'s workers through the agents: one message per host (I/O thread)."""
        lost = [a for a in self.agents if a.lost is not None]
        if lost:
            raise MeshFailure(
                f"host {lost[0].label} is lost ({lost[0].lost}); start a new host mesh",
                ranks=tuple(range(len(group.shape))),
            )
        world = len(group.shape)
        per_host = world // len(self.agents)
        master = self.agents[0]
        # A port the first host's agent found free at its last heartbeat (or its
        # hello). Two meshes started within one heartbeat would get the same
        # report: the second takes the next port no mesh was given, which
        # nobody checked (the report a second later is).
        master_port = master.free_port
        while master_port in self._ports_given:
            master_port += 1
        self._ports_given.add(master_port)
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_PREFIX)}
        workers: list[WorkerProcess] = []
        specs: dict[int, list[tuple[str, dict[str, str], dict[str, Any]]]] = {}
        for rank, identity in enumerate(identities):
            agent = self._agent_of_rank(group, rank)
            local_rank = rank % per_host
            env = dict(
                forwarded,
                RANK=str(rank),
                LOCAL_RANK=str(local_rank),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(per_host),
                GROUP_RANK=str(agent.index),
                NODE_RANK=str(agent.index),
                MASTER_ADDR=master.address,
                MASTER_PORT=str(master_port),
                PYTHONUNBUFFERED="1",
            )
            if group.gpus:
                env["MONARCH_NB_LOCAL_GPU"] = str(local_rank)  # mapped by the agent
            env.update(group.extra_env)
            boot = dict(bootstrap, identity=identity.decode(), rank=rank)
            specs.setdefault(agent.index, []).append((identity.decode(), env, boot))
            worker = RemoteWorker(rank, identity, agent)
            agent.workers[identity] = (group, worker)
            group.hosts[rank] = agent.label
            workers.append(worker)
        group.workers = workers
        for index, spec in specs.items():
            self.send(self.agents[index], LaunchWorkers(tuple(spec)))

    # -- any thread -------------------------------------------------------------------

    def read_logs(
        self, group: HostedGroup, ranks: Sequence[int], request: ReadLogs, timeout: float
    ) -> list[tuple[int, str, str, str]]:
        """``(rank, ISO time, stream, text)`` of ``ranks``' log lines, from the host of
        each (``request`` says what to read; its ranks and id are set per host)."""
        by_agent: dict[int, list[int]] = {}
        for rank in ranks:
            by_agent.setdefault(self._agent_of_rank(group, rank).index, []).append(rank)
        asked = []
        try:
            for index, mine in by_agent.items():
                agent = self.agents[index]
                if agent.lost is not None:
                    raise MeshFailure(
                        f"cannot read the logs of ranks {format_ranks(mine)}: their host "
                        f"{agent.label} {agent.lost}",
                        ranks=mine,
                    )
                request_id = next(self._log_read_ids)
                future: concurrent.futures.Future[LogLines] = concurrent.futures.Future()
                self._log_reads[request_id] = (future, agent)
                asked.append((agent, mine, request_id, future))
                self.send(
                    agent,
                    dataclasses.replace(request, request_id=request_id, ranks=tuple(mine)),
                )
            lines: list[tuple[int, str, str, str]] = []
            deadline = time.monotonic() + timeout
            for agent, mine, _, future in asked:
                try:
                    answer = future.result(max(0.0, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    raise CallTimeout(
                        f"host {agent.label} did not send the logs of ranks "
                        f"{format_ranks(mine)} within {timeout} s",
                        ranks=mine,
                    ) from None
                if answer.error:
                    raise OSError(
                        f"host {agent.label} could not read the logs of ranks "
                        f"{format_ranks(mine)}: {answer.error}"
                    )
                lines.extend(answer.lines)
            return lines
        finally:
            for _, _, request_id, _ in asked:
                self._log_reads.pop(request_id, None)

    def send(self, agent: AgentLink, message: Message) -> None:
        self.controller.agent_links.send(agent.identity, self.signer.encode(message))

    def sync_workspace(
        self, archive: bytes, dest: str, on_path: bool, timeout: float
    ) -> list[tuple[str, WorkspaceSynced]]:
        """Send ``archive`` to every host's agent to unpack under ``dest``; each
        host's label and answer, or OSError naming the hosts that failed."""
        asked = []
        try:
            for agent in self.agents:
                if agent.lost is not None:
                    raise MeshFailure(
                        f"cannot sync the workspace to {agent.label}: it {agent.lost}"
                    )
                request_id = next(self._log_read_ids)
                future: concurrent.futures.Future[WorkspaceSynced] = concurrent.futures.Future()
                self._syncs[request_id] = (future, agent)
                asked.append((agent, request_id, future))
                self.send(agent, SyncWorkspace(request_id, dest, archive, on_path))
            deadline = time.monotonic() + timeout
            answers = []
            for agent, _, future in asked:
                try:
                    answers.append(
                        (agent.label, future.result(max(0.0, deadline - time.monotonic())))
                    )
                except concurrent.futures.TimeoutError:
                    raise CallTimeout(
                        f"host {agent.label} did not finish unpacking the workspace within "
                        f"{timeout} s"
                    ) from None
            failed = [f"{label}: {answer.error}" for label, answer in answers if answer.error]
            if failed:
                raise OSError("sync_workspace failed on " + "; ".join(failed))
            return answers
        finally:
            for _, request_id, _ in asked:
                self._syncs.pop(request_id, None)

    def shutdown(self, grace: float = 5.0) -> None:
        """Stop the process meshes on these hosts, then every agent and the
        launchers (blocking)."""
        if self.shut_down:
            return
        # Stopped on purpose, not failed: the meshes first, as their owner would.
        for group in self.controller.run(self._groups):
            try:
                group.stop(grace)
            except Exception:
                _log.exception("monarch_nb: could not stop %r", group.name)
        self.shut_down = True
        for agent in self.agents:
            if agent.lost is None and agent.ready.is_set():
                self.send(agent, AgentShutdown())
        deadline = time.monotonic() + grace

        def close_stdin() -> None:
            for launcher in self.launchers:
                if launcher.popen.stdin is not None and not launcher.popen.stdin.closed:
                    launcher.popen.stdin.close()

        self.controller.run(close_stdin)
        for launcher in list(self.launchers):
            try:
                launcher.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                launcher.popen.kill()
                launcher.popen.wait()

        def forget() -> None:
            for agent in self.agents:
                self.controller.agent_links.remove(agent.identity)
                if agent.connected_to is not None:  # attach(): free the agent for the next
                    self.controller.agent_links.disconnect(agent.connected_to)

        self.controller.run(forget)

    # -- I/O thread -------------------------------------------------------------------

    def _groups(self) -> list[HostedGroup]:
        """The process meshes with live workers on these hosts."""
        found: dict[int, HostedGroup] = {}
        for agent in self.agents:
            for group, _ in agent.workers.values():
                found[group.id] = group
        return list(found.values())

    def on_agent_message(self, agent: AgentLink, frames: list[Any]) -> None:
        try:
            message = self.signer.verify(frames, agent.window, sender=agent.tag)
        except UnknownMessage as exc:
            _log.error("monarch_nb: the agent on %s sent %s", agent.label, exc)
            return
        if message is None or agent.lost is not None:
            return
        agent.last_heard = time.monotonic()
        match message:
            case AgentHeartbeat(free_port):
                if free_port:  # checked free on its host a moment ago
                    agent.free_port = free_port
            case WorkerOutput(identity, stream, data):
                entry = agent.workers.get(identity.encode())
                if entry is not None:
                    entry[0].on_output(entry[1], stream, data)
            case WorkerStarted(identity, pid):
                entry = agent.workers.get(identity.encode())
                if entry is not None:
                    entry[1].pid = pid
            case WorkerExited(identity, returncode):
                entry = agent.workers.pop(identity.encode(), None)
                if entry is not None:
                    group, worker = entry
                    for stream in ("stdout", "stderr"):
                        group.output_ended(worker, stream)
                    worker.returncode = returncode
                    worker.exited.set()
                    group.worker_exited(worker)
            case LogLines(request_id):
                waiting = self._log_reads.get(request_id)
                if waiting is not None and not waiting[0].done():
                    waiting[0].set_result(message)
            case WorkspaceSynced(request_id):
                sync = self._syncs.get(request_id)
                if sync is not None and not sync[0].done():
                    sync[0].set_result(message)
            case PySpyReply(request_id, returncode, stdout, stderr, data):
                future = self.py_spy_requests.pop(request_id, None)
                if future is not None:
                    future.set_result(_py_spy.Outcome(returncode, stdout, stderr, data))
            case TreeListening():
                self.tree.on_listening(agent, message)
            case FoldedReply():
                on_folded(self, agent, message)
            case AgentSuperseded(hostname, pid):
                self.lose(
                    agent,
                    f"was taken over: another controller attached to its agent ({hostname}, "
                    f"pid {pid}), and an agent serves the newest only",
                )
            case AgentHello(index, hostname, address, pid, free_port, gpus):
                if index != agent.index:
                    _log.error("monarch_nb: agent %s said it is host %d", agent.label, index)
                    return
                agent.hostname, agent.address, agent.pid = hostname, address, pid
                agent.free_port, agent.gpus = free_port, gpus
                if agent.named_by_agent:
                    agent.label = hostname
                agent.ready.set()
            case _:
                _log.error(
                    "monarch_nb: the agent on %s sent %s, which a controller does not handle",
                    agent.label,
                    type(message).__name__,
                )

    def _tick(self) -> None:
        if self.shut_down:
            return
        now = time.monotonic()
        for agent in self.agents:
            if agent.lost is not None:
                continue
            silent = now - agent.last_heard
            if silent > self.timeout_s:
                self.lose(
                    agent,
                    f"stopped answering (no heartbeat for {silent:.1f} s: a network cut, "
                    "or the host is down)",
                )
            else:
                self.send(agent, AgentHeartbeat())
        self.controller.loop.call_later(self.heartbeat_s, self._tick)

    def lose(self, agent: AgentLink, why: str) -> None:
        """``agent``'s host is gone: fail its ranks, one failure per process mesh."""
        if agent.lost is not None:
            return
        agent.lost = why
        _log.warning("monarch_nb: host %s %s", agent.label, why)
        for request_id, (future, asked) in list(self._log_reads.items()):
            if asked is agent and not future.done():
                future.set_result(LogLines(request_id, (), f"the host {why}"))
        for request_id, (synced, asked) in list(self._syncs.items()):
            if asked is agent and not synced.done():
                synced.set_result(WorkspaceSynced(request_id, "", 0, 0, f"the host {why}"))
        by_group: dict[int, tuple[HostedGroup, list[WorkerProcess]]] = {}
        for group, worker in agent.workers.values():
            by_group.setdefault(group.id, (group, []))[1].append(worker)
            worker.exited.set()
        agent.workers.clear()
        for group, workers in by_group.values():
            group.host_lost(workers, agent.label, why)
        self.tree.lost(agent, why)

    def _launcher_exited(self, launcher: LauncherProcess, pidfd: int) -> None:
        loop = self.controller.loop
        loop.remove_fd(pidfd)
        os.close(pidfd)
        launcher.popen.wait()
        assert launcher.popen.stderr is not None
        if not launcher.popen.stderr.closed:
            self._launcher_stderr(launcher)
            loop.remove_fd(launcher.popen.stderr.fileno())
            launcher.popen.stderr.close()
        if self.shut_down:
            return
        why = launcher.describe_end()
        for agent in self.agents:
            if agent.launcher is not launcher:
                continue
            if agent.ready.is_set():
                self.lose(agent, f"lost its agent: {why}")
            else:  # never came up: wait_ready() says why
                agent.lost = why
                self.failure = self.failure or why

    def _launcher_stderr(self, launcher: LauncherProcess) -> None:
        pipe = launcher.popen.stderr
        assert pipe is not None
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.controller.loop.remove_fd(pipe.fileno())
            return
        *lines, launcher.partial = (launcher.partial + chunk).split(b"\n")
        for line in lines:
            text = line.decode(errors="replace").rstrip()
            launcher.stderr_tail.append(text)
            _log.debug("monarch_nb: %s: %s", launcher.what, text)
