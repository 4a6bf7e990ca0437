"""Which address and interface this host uses, for the workers' environment."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import struct
from urllib.parse import urlsplit

_SIOCGIFADDR = 0x8915


def source_address_towards(url: str) -> str:
    """The local address packets to ``tcp://host:port`` leave from (no packet is sent)."""
    parts = urlsplit(url)
    if not parts.hostname:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((parts.hostname, parts.port or 9))
        except OSError:
            return "127.0.0.1"
        return s.getsockname()[0]


def interface_of(address: str) -> str | None:
    """The name of the interface holding IPv4 ``address`` (Linux), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                request = struct.pack("256s", name[:15].encode())
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


# Where to look for a port that a later listener will bind: below the kernel's
# ephemeral range, which every outgoing connection (zmq, gloo, ssh) draws its
# local port from. A port bind(0) hands out lies inside that range, so between
# choosing it and binding it (a worker's start, torch's import) a connection on
# the same host could take it: EADDRINUSE for MASTER_PORT on a busy host.
# Up to 30000: Kubernetes routes 30000-32767 (NodePorts) without a socket bound.
_LISTEN_PORTS_FLOOR, _LISTEN_PORTS_CEILING = 10_000, 30_000
_TRIES = 64
# Not the random module's shared generator: a rank's user code may have seeded
# it alike on every rank, and one more draw on rank 0 would set it apart.
_random = random.SystemRandom()


def _ephemeral_ports() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(part) for part in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` now, for a listener that binds it later.

    Chosen at random outside the ephemeral range where there is room, so that no
    outgoing connection can take it meanwhile; ``bind(0)``'s port otherwise.
    Raises OSError (EMFILE, ENFILE) when no fd is left to probe with: a failed
    request for the caller to report, not a port in use."""
    low, high = _ephemeral_ports()
    top = min(low, _LISTEN_PORTS_CEILING)
    if top - _LISTEN_PORTS_FLOOR >= 1000:
        choices = range(_LISTEN_PORTS_FLOOR, top)
    elif 65535 - high >= 1000:
        choices = range(high + 1, 65536)
    else:
        choices = range(0)
    for _ in range(_TRIES if choices else 0):
        port = _random.choice(choices)
        # Also on every address: torch's store may listen on all of them.
        if _bindable(host, port) and (not host or _bindable("", port)):
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    # No SO_REUSEADDR: a port with a connection in TIME_WAIT counts as taken too.
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def worker_env(address: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what ranks on this host need to reach other hosts: the data plane
    and gloo/NCCL on the interface the controller is reached through (unless the
    user chose already)."""
    out = dict(env)
    out.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # see _process_group: faster RDMA reads
    if address and not address.startswith("127."):
        out.setdefault("MONARCH_NB_RDMA_HOST", address)
        interface = interface_of(address)
        if interface is not None:
            out.setdefault("GLOO_SOCKET_IFNAME", interface)
            out.setdefault("NCCL_SOCKET_IFNAME", interface)
    return out


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


def default_address() -> str:
    """This machine's address on its default route (no packet is sent)."""
    return source_address_towards("tcp://192.0.2.1:9")  # TEST-NET-1: never answered
