"""Monarch's simple bootstrap: ``run_worker_loop_forever`` on each host and
``attach_to_workers`` on the client.

::

    # on each host (started by anything: a pod, a login script, systemd)
    run_worker_loop_forever(address="tcp://0.0.0.0:7000", ca="/secrets/agent.key")

    # on the client: a HostMesh whose hosts are in the order of workers
    hosts = attach_to_workers(workers=["tcp://node1:7000", "tcp://node2:7000"],
                              ca="/secrets/agent.key")

The worker loop is this process become a listening host agent (the same as
``monarch-nb agent --listen ADDR --key-file F``); attaching is
:func:`~monarch_nb.attach`. No host is told its index when it starts: the
controller gives each agent its place, the position of its address in
``workers``, in the attach handshake, so one command starts every host.

Monarch's ``ca`` is a certificate authority file, and ``"trust_all_connections"``
turns checking off. Here ``ca`` is the path of a key file made by ``monarch-nb
keygen`` (private to its owner), the same file on every host and the client:
the worker loop admits only controllers that hold its keys, and the client
talks only to agents that do. ``"trust_all_connections"`` is refused, saying
what to do instead: a worker loop runs whatever code it is sent, so a port
anyone can drive would hand the host to anyone who can reach it. The key is
never on a command line (a path is), nor in the environment.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

import zmq

from .._agent._main import Agent
from .._controller._proc_mesh import HostMesh
from .._model._errors import MeshUsageError
from .._model._public import publish
from .._services import _config
from .._wire import _keys
from .._wire._fd_limits import raise_fd_limit
from ._launchers import attach

TRUST_ALL = "trust_all_connections"


def run_worker_loop_forever(
    *, ca: str | os.PathLike[str], address: str, private_key: Any = None
) -> None:
    """Serve this host to one controller at a time, forever (Monarch's): bind
    ``address`` (``tcp://HOST:PORT``, ``tcp://*:PORT``, ``ipc://PATH``; Monarch's
    ``ADVERTISED@BIND`` binds ``BIND``) and wait for :func:`attach_to_workers`.
    A controller that attaches gets this host; when it leaves (shuts the mesh
    down, is killed, or goes silent) its processes are killed and the loop waits
    for the next, with no idle limit (set ``MONARCH_NB_AGENT_IDLE_TIMEOUT`` for
    one). A newer attach ends the older session. ``ca``: the key file
    (``monarch-nb keygen FILE``) every host and the client share. Never returns:
    SIGTERM or SIGHUP ends the process (SystemExit), its workers with it."""
    key_file = _key_file(ca, private_key, "run_worker_loop_forever")
    bind, inherited_fd = _bind_address(address)
    try:
        # As `monarch-nb agent --listen` reads it; the index is a label until a
        # controller attaches and gives this host its place.
        config = {**_keys.agent_config_from_file(key_file), "host_index": 0}
        config["key_file"] = key_file
        config["listen_fd"] = inherited_fd
        # Forever, as its name says, unless MONARCH_NB_AGENT_IDLE_TIMEOUT asks for an
        # idle exit (that setting's default is for agents a job started, not these).
        explicit = os.environ.get("MONARCH_NB_AGENT_IDLE_TIMEOUT") is not None
        config["idle_timeout_s"] = _config.get("agent_idle_timeout") if explicit else 0.0
    except (PermissionError, ValueError) as exc:  # says what is wrong and what to run
        raise MeshUsageError(f"run_worker_loop_forever(ca={ca!r}): {exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    raise_fd_limit()  # a listening endpoint holds an fd per connection, keyed or not
    if threading.current_thread() is threading.main_thread():
        # A stop from whatever started the host ends the loop, and the workers with it.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.signal(signal.SIGHUP, lambda *_: sys.exit(0))
    try:
        agent = Agent(config, listen=bind)
    except zmq.ZMQError as exc:
        raise MeshUsageError(
            f"run_worker_loop_forever(address={address!r}) cannot listen on {bind!r}: {exc} "
            "(is the port taken, or the address not this host's?)"
        ) from None
    try:
        agent.run()
    finally:
        agent.kill_all()


def attach_to_workers(
    *,
    ca: str | os.PathLike[str],
    workers: Sequence[Any],
    private_key: Any = None,
    name: str | None = None,
) -> HostMesh:
    """A HostMesh of the hosts serving :func:`run_worker_loop_forever` at
    ``workers`` (addresses, or futures of them), in that order: host ``i`` is
    ``workers[i]``. ``ca``: the key file the workers were started with. Blocks
    until every worker answered, as our other launchers do, so
    ``hosts.initialized`` is already done; a worker that cannot be reached, or
    that holds other keys, fails here naming its address. ``name`` is accepted
    as Monarch's (a label; our hosts are named by their addresses)."""
    key_file = _key_file(ca, private_key, "attach_to_workers")
    if isinstance(workers, str | bytes) or not isinstance(workers, Sequence):
        raise MeshUsageError(
            f"attach_to_workers(workers=...) takes a list of addresses, got {workers!r}"
        )
    if name is not None and not isinstance(name, str):
        raise MeshUsageError(f"attach_to_workers(name=...) takes a str, got {name!r}")
    addresses = [_dial_address(worker) for worker in workers]
    return attach(addresses, key_file=key_file)


def _key_file(ca: Any, private_key: Any, what: str) -> str:
    """The key file ``ca`` names, or a MeshUsageError saying what to pass."""
    make = (
        "Make a key file once with `monarch-nb keygen FILE`, give every host and the "
        "client a copy readable by its owner only (chmod 600), and pass its path: "
        "run_worker_loop_forever(address=..., ca=FILE) on each host, "
        "attach_to_workers(workers=[...], ca=FILE) on the client"
    )
    if private_key is not None:
        raise MeshUsageError(
            f"{what}(private_key=...): monarch_nb has no TLS certificates; the key file "
            f"given as ca= holds every key, so leave private_key out. {make}"
        )
    if ca == TRUST_ALL:
        raise MeshUsageError(
            f'{what}(ca="{TRUST_ALL}") is refused: monarch_nb never serves a connection it '
            "cannot authenticate (a worker loop runs whatever code it is sent, so an open "
            f"port would give the host to anyone who reaches it). {make}."
        )
    if isinstance(ca, bytes | bytearray):
        raise MeshUsageError(
            f"{what}(ca=<bytes>): pass the key file's path, not its contents (a path keeps "
            f"the key out of command lines and process listings). {make}."
        )
    if not isinstance(ca, str | os.PathLike) or not os.fspath(ca):
        raise MeshUsageError(f"{what}(ca={ca!r}) takes a key file's path. {make}.")
    return os.path.expanduser(os.fspath(ca))


def _split_alias(address: str) -> tuple[str, str]:
    """Monarch's address forms -> (what clients dial, what the host binds):
    ``URL``, ``ADVERTISED_URL@BIND_URL``, ``PROC_ID@URL`` (the id is dropped)."""
    if not isinstance(address, str) or not address:
        raise MeshUsageError(
            f"a worker address is a str such as 'tcp://host:7000', got {address!r}"
        )
    head, at, tail = address.partition("@")
    if at and "://" not in head:  # service<id>@URL: a proc id we do not need
        address = tail
        head, at, tail = address.partition("@")
    if at:
        return head, tail
    return address, address


def _check_url(address: str, url: str, *, inherited: bool = False) -> str:
    if url.startswith("ipc://") and len(url) > len("ipc://"):
        return url
    scheme, sep, rest = url.partition("://")
    host, colon, port = rest.rpartition(":")
    if port.startswith("fd") and not inherited:
        raise MeshUsageError(
            f"{address!r}: tcp://HOST:fdN is how a worker loop is handed a socket; clients "
            "dial its port: tcp://HOST:PORT"
        )
    port_ok = port.isdigit() or (inherited and port.startswith("fd") and port[2:].isdigit())
    if scheme != "tcp" or not sep or not host or not colon or not port_ok:
        forms = "tcp://HOST:PORT, tcp://HOST:fdN (a bound TCP socket it inherited)"
        raise MeshUsageError(
            f"{address!r} is not an address a worker loop serves on: give "
            f"{forms if inherited else 'tcp://HOST:PORT'} or ipc://PATH"
        )
    return url


def _bind_address(address: str) -> tuple[str, int | None]:
    """Where to bind, and the inherited socket's fd for ``tcp://HOST:fdN``
    (Monarch's form; zmq serves on that socket, ZMQ_USE_FD), else None."""
    url = _check_url(address, _split_alias(address)[1], inherited=True)
    fd_text = url.rpartition(":")[2]
    if not fd_text.startswith("fd"):
        return url, None
    fd = int(fd_text[2:])
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise MeshUsageError(f"{address!r}: fd {fd} is not an open socket here ({exc})") from None
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            raise MeshUsageError(f"{address!r}: fd {fd} is not a TCP socket")
        host, port = sock.getsockname()[:2]
        if not port:
            raise MeshUsageError(f"{address!r}: fd {fd} is not bound to a port; bind it first")
        sock.listen(256)  # bound is enough, as Monarch's; zmq takes it as it is
    finally:
        sock.detach()  # the fd stays open: it is the agent's now
    host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{port}", fd


def _dial_address(worker: Any) -> str:
    if not isinstance(worker, str) and callable(getattr(worker, "get", None)):
        worker = worker.get()  # Monarch's workers may be futures of addresses
    dial = _split_alias(worker)[0]
    if dial.startswith("tcp://*:") or dial.startswith("tcp://0.0.0.0:"):
        raise MeshUsageError(
            f"attach_to_workers: {worker!r} is where a worker binds, not where to reach it; "
            "give the host's name or address (tcp://node1:7000)"
        )
    return _check_url(worker, dial)


publish(globals())
