"""Launchers: start one agent per host with the tools people already have.

Each is a thin adapter: it runs ``ssh`` or ``srun`` (or connects to agents
someone else started) and hands the agents their keys through that tool's own
channel, stdin, which stays open for the mesh's life (its end stops them).
None is a scheduler of ours.

::

    hosts = ssh_hosts(["node1", "node2"])              # ssh node1 python -m monarch_nb.agent
    hosts = slurm_hosts(nodes=2, partition="gpu", gpus_per_node=8)    # one srun
    hosts = attach(["tcp://10.0.0.5:7000"], key_file="~/.monarch_nb/agent.key")
    procs = hosts.spawn_procs(per_host={"gpus": 8})    # dims (hosts, gpus)
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from .._controller._client import Controller
from .._controller._hosts import HOST_TIMEOUT_S, HostAgents
from .._controller._proc_mesh import HostMesh
from .._controller._process_group import START_TIMEOUT_S
from .._model._errors import MeshUsageError
from .._model._public import publish
from .._runtime import _peer
from .._wire import _keys, _network
from .._wire._messages import AgentAttach

DEFAULT_SSH = ("ssh", "-T", "-o", "BatchMode=yes")


def ssh_hosts(
    hosts: Sequence[str],
    *,
    python: str | None = None,
    env_setup: str | None = None,
    ssh: Sequence[str] = DEFAULT_SSH,
    ssh_options: Sequence[str] = (),
    bind: str | None = None,
    reverse: bool = False,
    heartbeat_timeout: float = HOST_TIMEOUT_S,
    timeout: float = START_TIMEOUT_S,
    controller: Controller | None = None,
) -> HostMesh:
    """Start an agent on each of ``hosts`` over ssh; a HostMesh of them.

    ``python``: the interpreter on the hosts, or a virtual environment's
    directory there (default: this one's path, as on a shared file system);
    ``env_setup``: shell commands run first in the same remote shell, e.g.
    ``"source /opt/env.sh"`` or ``"module load cuda"`` (what they export, the
    agent and its workers inherit); ``ssh_options``: e.g. ``["-F", "cluster.conf"]``;
    ``bind``: this machine's address the hosts connect back to (default: the one
    it reaches the first host from); ``heartbeat_timeout``: seconds of silence
    after which a host counts as lost (default 5, or ``MONARCH_NB_HOST_TIMEOUT``).
    ``reverse``: the hosts cannot reach this machine (a laptop behind NAT): the
    controller listens on loopback only and each ssh carries the way back
    (``ssh -R``) to a Unix socket in the remote user's private directory
    (``~/.monarch_nb/tunnels``, mode 0700), which agents and ranks dial: no
    other user of a host can reach the controller through it. Where ssh cannot
    forward to a Unix socket, it forwards the same port numbers on the host's
    loopback instead (reachable by its other users, so capped as any port is).
    Ranks reach each other on the address ssh reached their host at.
    Blocks until every agent reported, or raises naming the host and what ssh said.
    """
    hosts = _host_list(hosts, "ssh_hosts")
    controller = controller or Controller.get()
    if reverse:
        if bind is not None and not bind.startswith("127."):
            raise MeshUsageError(
                f"ssh_hosts(reverse=True, bind={bind!r}): with reverse the controller "
                "listens on loopback only (the hosts come back through ssh); leave bind out"
            )
        bind = bind or "127.0.0.1"
    bind = bind or _network.source_address_towards(f"tcp://{_hostname(hosts[0])}:22")
    agents = HostAgents(controller, hosts, timeout_s=heartbeat_timeout)
    agents.ssh_command = [*ssh, *ssh_options]  # sync_workspace's rsync goes the same way
    endpoint = agents.listen(bind)
    remote = agent_command(python, env_setup)
    ports = [urlsplit(endpoint).port or 0, _peer.local_node().tcp_port(bind)] if reverse else []

    def start() -> None:
        for agent in agents.agents:
            boot = agents.bootstrap(endpoint, agent)
            boot["reverse"] = reverse
            tunnels: list[str] = []
            if reverse:
                ssh_to = [*ssh, *ssh_options, agent.label]
                tunnels, boot["tunnels"] = _reverse_tunnels(ssh_to, ports, bind)
            line = json.dumps(boot).encode() + b"\n"
            argv = [*ssh, *ssh_options, *tunnels, agent.label, remote]
            agents.start_process(f"ssh to {agent.label}", argv, [line], [agent])

    return _started(agents, start, timeout)


# Where a host keeps the Unix sockets of reverse tunnels: private to its user.
_TUNNEL_DIR_COMMAND = (
    "umask 077 && mkdir -p ~/.monarch_nb/tunnels && chmod 700 ~/.monarch_nb ~/.monarch_nb/tunnels"
    " && cd ~/.monarch_nb/tunnels && pwd"
)
_MAX_IPC_PATH = 100  # a Unix socket's path fits in 107 bytes, ipc:// aside


def _reverse_tunnels(
    ssh_to: list[str], ports: list[int], bind: str
) -> tuple[list[str], dict[str, str]]:
    """ssh options that carry, from a host back to this controller at ``bind``,
    ``ports`` (its agents' endpoint and the inbox where ranks' actors answer it),
    and what the host dials for each ``tcp://127.0.0.1:PORT`` it is given.

    Each port is forwarded to a Unix socket in the host user's private tunnel
    directory, found (and made) by one ssh command first; the host dials
    ``ipc://`` there, which no other user of it can open. Where that directory
    cannot be had (ssh refused the command, a path too long for a socket), the
    same port number on the host's loopback instead: then every address works
    there as here. A forward that cannot be opened fails that ssh at once
    (ExitOnForwardFailure), naming it."""
    options = ["-o", "ExitOnForwardFailure=yes"]
    directory = _tunnel_directory(ssh_to)
    token = os.urandom(6).hex()
    dials: dict[str, str] = {}
    for port in ports:
        path = f"{directory}/{token}-{port}.sock" if directory else ""
        if path and len(path) <= _MAX_IPC_PATH:
            options += ["-R", f"{path}:{bind}:{port}"]
            dials[f"tcp://127.0.0.1:{port}"] = f"ipc://{path}"
        else:
            options += ["-R", f"127.0.0.1:{port}:{bind}:{port}"]
    return options, dials


def _tunnel_directory(ssh_to: list[str]) -> str | None:
    """The host user's private tunnel directory (absolute), or None if ssh could
    not make it (the loopback fallback then)."""
    try:
        done = subprocess.run(
            [*ssh_to, _TUNNEL_DIR_COMMAND],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("/"):
        return None
    return lines[-1]


def agent_command(python: str | None, env_setup: str | None) -> str:
    """The remote shell command that starts a host's agent (see :func:`host_prelude`)."""
    return host_prelude(python, env_setup) + 'exec "$p" -m monarch_nb.agent'


def host_prelude(python: str | None, env_setup: str | None) -> str:
    """Shell lines run on a host before its agent: ``env_setup`` first (what it
    exports, the agent and its workers inherit; its failure stops the start,
    saying so), then ``$p`` set to the interpreter: ``python`` may name one or a
    virtual environment's directory on that host (default: this one's path, as
    on a shared file system). Every launcher starts its agents after these."""
    interpreter = shlex.quote(python or sys.executable)
    pick = f'p={interpreter}; if [ -d "$p" ]; then p="$p/bin/python"; fi\n'
    if not env_setup:
        return pick
    failed = shlex.quote(f"monarch_nb: env_setup failed: {env_setup}")
    return f"{env_setup} || {{ echo {failed} >&2; exit 97; }}\n{pick}"


def slurm_hosts(
    nodes: int,
    *,
    partition: str | None = None,
    gpus_per_node: int | None = None,
    time_limit: str | None = None,
    account: str | None = None,
    srun: Sequence[str] = ("srun",),
    srun_args: Sequence[str] = (),
    python: str | None = None,
    env_setup: str | None = None,
    bind: str | None = None,
    heartbeat_timeout: float = HOST_TIMEOUT_S,
    timeout: float = START_TIMEOUT_S,
    controller: Controller | None = None,
) -> HostMesh:
    """Start an agent on each of ``nodes`` SLURM nodes with one ``srun``.

    Inside an allocation (``salloc``, ``sbatch``) srun uses it; outside, srun
    asks for one (``partition``, ``gpus_per_node``, ``time_limit``, ``account``,
    anything else in ``srun_args``) and waits for it, up to ``timeout`` s. The
    keys go to every agent on srun's stdin. ``python`` and ``env_setup`` as for
    :func:`ssh_hosts`, on every node. ``bind``: this machine's address the nodes
    connect back to (default: the address of its default route).
    """
    if not isinstance(nodes, int) or nodes < 1:
        raise MeshUsageError(f"slurm_hosts(nodes=...) needs a positive int, got {nodes!r}")
    controller = controller or Controller.get()
    bind = bind or _network.default_address()
    agents = HostAgents(
        controller, [f"node {i}" for i in range(nodes)], timeout_s=heartbeat_timeout
    )
    for agent in agents.agents:
        agent.named_by_agent = True
    endpoint = agents.listen(bind)
    argv = [
        *srun,
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--input=all",  # every agent reads the bootstrap
        "--job-name=monarch_nb",
    ]
    for flag, value in (
        ("--partition", partition),
        ("--gpus-per-node", gpus_per_node),
        ("--time", time_limit),
        ("--account", account),
    ):
        if value is not None:
            argv.append(f"{flag}={value}")
    argv += [*srun_args, "sh", "-c", agent_command(python, env_setup)]
    boot = json.dumps(agents.bootstrap(endpoint, None)).encode() + b"\n"
    every = agents.agents
    return _started(agents, lambda: agents.start_process("srun", argv, [boot], every), timeout)


def attach(
    addresses: Sequence[str],
    *,
    key_file: str,
    heartbeat_timeout: float = HOST_TIMEOUT_S,
    timeout: float = START_TIMEOUT_S,
    controller: Controller | None = None,
) -> HostMesh:
    """Use agents started by any other tool (``monarch-nb agent --listen
    tcp://0.0.0.0:7000 --key-file F``, e.g. in Kubernetes pods): connect to each
    of ``addresses`` (``tcp://host:port``) with the keys in ``key_file`` (made by
    ``monarch-nb keygen F``, readable by its owner only, the same file the agents
    read)."""
    addresses = _host_list(addresses, "attach")
    for address in addresses:
        parts = urlsplit(address)
        if address.startswith("ipc://") and len(address) > len("ipc://"):
            continue  # an agent on this host, at a Unix socket
        if parts.scheme != "tcp" or not parts.hostname or not parts.port:
            raise MeshUsageError(
                f"attach() needs tcp://host:port (or ipc://PATH) addresses, got {address!r}"
            )
    keys = _keys.read_key_file(os.path.expanduser(key_file))
    controller = controller or Controller.get()
    agents = HostAgents(controller, addresses, keys=keys, timeout_s=heartbeat_timeout)
    curve = keys["curve"]

    def handshake_failed(endpoint: str) -> None:  # I/O thread
        if endpoint in addresses and agents.failure is None:
            agents.failure = (
                f"the agent at {endpoint} refused our keys (the CURVE handshake failed): "
                f"attach(key_file={key_file!r}) must name a copy of the key file the agent "
                "was started with (monarch-nb agent --key-file), or what listens there is "
                "not a monarch_nb agent"
            )
            agents.advice = ""

    def start() -> None:
        for agent in agents.agents:
            # What the other hosts reach this one at; an ipc:// agent is on this host.
            hostname = urlsplit(agent.label).hostname
            host = socket.gethostbyname(hostname) if hostname else "127.0.0.1"

            def connect(agent=agent) -> None:
                controller.agent_links.connect_curve(
                    agent.label,
                    agent.identity,
                    curve["server_public"],
                    curve["client_public"],
                    curve["client_secret"],
                )

            controller.run(connect)
            agent.connected_to = agent.label
            agents.send(agent, AgentAttach(host, agent.identity.decode(), agent.index))

    stop_watching = controller.run(
        lambda: controller.agent_links.watch_handshakes(handshake_failed)
    )
    try:
        return _started(agents, start, timeout)
    finally:
        controller.run(stop_watching)


def _started(agents: HostAgents, start: Callable[[], None], timeout: float) -> HostMesh:
    """Run ``start`` (launch or reach the agents), wait until each said hello; on
    any failure stop whatever did start before raising."""
    try:
        start()
    except BaseException:
        agents.shutdown()
        raise
    agents.wait_ready(timeout)
    return HostMesh(agents.controller, agents)


def _host_list(hosts: Sequence[str], what: str) -> list[str]:
    if isinstance(hosts, str):
        hosts = [h for h in hosts.split(",") if h]
    hosts = list(hosts)
    if not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise MeshUsageError(f"{what}() needs a non-empty list of host names, got {hosts!r}")
    if len(set(hosts)) != len(hosts):
        raise MeshUsageError(f"{what}() got a host twice: {hosts!r}")
    return hosts


def _hostname(host: str) -> str:
    """``user@node1`` -> ``node1``."""
    return host.rpartition("@")[2]


publish(globals())
