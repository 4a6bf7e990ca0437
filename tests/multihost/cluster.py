"""Several "hosts" on one machine: Linux network namespaces, each with its own sshd.

``NetnsCluster(n)`` builds, in the root namespace, a bridge holding the
controller's address 10.X.Y.1/24 and, for each host i, a namespace joined to the
bridge by a veth pair, with the address 10.X.Y.(i+2), its own hostname
(``host<i>``, in a UTS namespace of its own, resolvable on every host through
an /etc/hosts bind-mounted in a mount namespace of its own) and an OpenSSH
server reachable with a per-cluster key.
Processes in the namespaces share this machine's filesystem and pid namespace,
so ``ssh <host> <sys.executable> -m monarch_nb.agent`` runs this very interpreter.

The machine's own network is left alone: in the root namespace the cluster adds
only its bridge (and so a connected route to its private /24, one no address or
route there overlaps); no sysctl, no default route, no firewall rule. Everything
is removed on ``close()``.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence

from system import (
    ClosedOnExit,
    CommandError,
    attempt,
    check,
    kill_and_wait,
    pid_alive,
    root_and_tools_reason,
)

SSHD = "/usr/sbin/sshd"
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "ssh", "ssh-keygen", SSHD)
# Namespace names carry the owner's pid, so a later run can remove what a
# killed run left behind (see remove_stale_clusters).
_NAMESPACE_RE = re.compile(r"^mnb-(\d+)-([0-9a-f]{6})-h\d+$")
# Subnets are drawn from 10.200.0.0/16 .. 10.249.255.0/24: far from the usual
# 10.0.x / 10.1.x of container and VPN networks.
_SUBNET_FIRST_OCTETS = range(200, 250)
# Shared by every cluster on the machine, hence never removed (an empty file).
_LOCK_PATH = os.path.join(tempfile.gettempdir(), "monarch-nb-netns.lock")
# A host's sshd started in the background answers within milliseconds; this is
# for loaded CI machines.
SSHD_START_TIMEOUT_S = 10.0


def unavailable_reason() -> str | None:
    """Why a NetnsCluster cannot be built on this machine, or None if it can."""
    reason = root_and_tools_reason(REQUIRED_TOOLS, "network namespaces")
    if reason:
        return reason
    # What host_argv does, on a throwaway namespace: a container without
    # CAP_SYS_ADMIN fails here, and the tests skip instead of erroring.
    probe = f"mnb-probe-{os.getpid()}"
    try:
        check(["ip", "netns", "add", probe])
        check(["nsenter", f"--net=/run/netns/{probe}", "unshare", "--mount", "--uts", "true"])
    except CommandError as e:
        return f"cannot make a namespace host: {e}"
    finally:
        attempt(["ip", "netns", "del", probe])
    return None


class NetnsCluster(ClosedOnExit):
    """``n_hosts`` namespaces reachable by ssh from the root namespace; a context manager."""

    def __init__(self, n_hosts: int, *, connect_timeout_s: int = 5) -> None:
        if n_hosts < 1 or n_hosts > 200:
            raise ValueError(f"n_hosts must be in 1..200, not {n_hosts}")
        self.n_hosts = n_hosts
        self._connect_timeout_s = connect_timeout_s
        self._tag = secrets.token_hex(3)
        self._owner = f"mnb-{os.getpid()}-{self._tag}"
        # Interface names are limited to 15 characters: "mnb" + 6 hex + suffix.
        self._bridge = f"mnb{self._tag}br"
        self._sshd: dict[int, subprocess.Popen[bytes]] = {}
        self._seen_pids: set[int] = set()
        self._closed = False
        self.workdir = tempfile.mkdtemp(prefix=f"{self._owner}-")
        self.hosts: list[str] = []
        self.hostnames = [f"host{i}" for i in range(n_hosts)]
        self.controller_address = ""
        self.ssh_config = os.path.join(self.workdir, "ssh_config")
        # A directory every host sees as its own empty tmpfs (its own mount
        # namespace): what a host without a shared file system has there.
        self.private_dir = os.path.join(self.workdir, "private")
        os.makedirs(self.private_dir)
        self.ssh_options = ["-F", self.ssh_config]
        self._register_close_at_exit()
        try:
            remove_stale_clusters()
            self._build_network()
            self._write_keys_and_configs()
            for i in range(n_hosts):
                self.start_sshd(i)
        except BaseException:
            self.close()
            raise

    # -- naming ---------------------------------------------------------------

    def namespace(self, i: int) -> str:
        """The network namespace name of host ``i`` (``ip netns pids``; to run
        something there, host_argv also gives it the host's name and /etc/hosts)."""
        self._check_index(i)
        return f"{self._owner}-h{i}"

    def veth(self, i: int) -> str:
        """The root-namespace end of host ``i``'s link (the "cable" cut_link pulls)."""
        self._check_index(i)
        return f"mnb{self._tag}h{i}"

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.n_hosts:
            raise IndexError(f"host {i} of a {self.n_hosts}-host cluster")

    # -- building -------------------------------------------------------------

    def _build_network(self) -> None:
        # The lock makes choosing a free subnet and claiming it (the bridge's
        # address) one step for clusters built in parallel on this machine.
        with open(_LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _free_subnet(self._tag)
            addresses = list(subnet.hosts())
            self.controller_address = str(addresses[0])
            self.hosts = [str(addresses[i + 1]) for i in range(self.n_hosts)]
            check(["ip", "link", "add", self._bridge, "type", "bridge"])
            # Docker-style hosts filter bridged frames through iptables
            # (br_netfilter); our test bridge opts out, for itself only.
            attempt(["ip", "link", "set", self._bridge, "type", "bridge", "nf_call_iptables", "0"])
            check(["ip", "link", "set", self._bridge, "alias", self._owner])
            check(["ip", "addr", "add", f"{self.controller_address}/24", "dev", self._bridge])
            check(["ip", "link", "set", self._bridge, "up"])
        hosts_file = self._hosts_file()
        root_addresses = _root_addresses()
        for i, address in enumerate(self.hosts):
            ns = self.namespace(i)
            check(["ip", "netns", "add", ns])
            check(["ip", "-n", ns, "link", "set", "lo", "up"])
            check(["ip", "link", "add", self.veth(i), "type", "veth", "peer", "eth0", "netns", ns])
            check(["ip", "link", "set", self.veth(i), "master", self._bridge, "up"])
            check(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"])
            check(["ip", "-n", ns, "link", "set", "eth0", "up"])
            # The controller's other addresses (eth0's, say) are reachable too,
            # as on a real network: host routes to them through the bridge,
            # delivered locally by the root namespace (nothing is forwarded).
            for local in root_addresses:
                check(
                    ["ip", "-n", ns, "route", "add", f"{local}/32", "via", self.controller_address]
                )
            with open(self._hosts_path(i), "w") as f:
                f.write(hosts_file)

    def _hosts_file(self) -> str:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines.append(f"{self.controller_address}\tcontroller")
        lines += [f"{a}\t{n}" for a, n in zip(self.hosts, self.hostnames, strict=True)]
        return "\n".join(lines) + "\n"

    def _write_keys_and_configs(self) -> None:
        client_key = os.path.join(self.workdir, "id_ed25519")
        _keygen(client_key, comment=f"{self._owner}-client")
        shutil.copy(f"{client_key}.pub", os.path.join(self.workdir, "authorized_keys"))
        known_hosts = []
        for i in range(self.n_hosts):
            host_key = self._path(f"host{i}_ed25519")
            _keygen(host_key, comment=self.hostnames[i])
            with open(f"{host_key}.pub") as f:
                key_type, key = f.read().split()[:2]
            known_hosts.append(f"{self.hosts[i]},{self.hostnames[i]} {key_type} {key}\n")
            with open(self._path(f"sshd{i}_config"), "w") as f:
                f.write(self._sshd_config(i, host_key))
        with open(self._path("known_hosts"), "w") as f:
            f.writelines(known_hosts)
        with open(self.ssh_config, "w") as f:
            f.write(self._client_config(client_key))

    def _sshd_config(self, i: int, host_key: str) -> str:
        return f"""\
ListenAddress {self.hosts[i]}
Port 22
HostKey {host_key}
PidFile {self._path(f"sshd{i}.pid")}
AuthorizedKeysFile {self._path("authorized_keys")}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# No PAM: nothing in /etc/pam.d (nor a login session) is needed in a container.
UsePAM no
# The key files live in the test's temp dir under /tmp, which StrictModes rejects.
StrictModes no
# What Debian's default sshd_config accepts: launchers cannot rely on SendEnv.
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
"""

    def _client_config(self, client_key: str) -> str:
        aliases = "".join(
            f"Host {name}\n    HostName {address}\n\n"
            for name, address in zip(self.hostnames, self.hosts, strict=True)
        )
        return f"""\
{aliases}Host *
    User root
    IdentityFile {client_key}
    IdentitiesOnly yes
    UserKnownHostsFile {self._path("known_hosts")}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    PasswordAuthentication no
    ConnectTimeout {self._connect_timeout_s}
    # A cut link ends the ssh session in ~3 s instead of TCP's minutes.
    ServerAliveInterval 1
    ServerAliveCountMax 3
    LogLevel ERROR
"""

    def _path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    def _hosts_path(self, i: int) -> str:
        """Host ``i``'s /etc/hosts: every host's name, its own included, and the controller's."""
        return self._path(f"hosts{i}")

    # -- running things on a host ---------------------------------------------

    def host_argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run as if on host ``i``: its network namespace, hostname and
        /etc/hosts, and a private tmpfs on ``private_dir`` (each call its own)."""
        # Not `ip netns exec`: it mounts a fresh /sys, without /sys/fs/cgroup,
        # where slurmd fails ("No filesystem mounted on /sys/fs/cgroup"). A
        # private mount namespace (unshare --mount) carries the /etc/hosts bind.
        enter = (
            'hostname "$0" && mount --bind "$1" /etc/hosts && '
            'mount -t tmpfs -o size=1g,mode=0700 tmpfs "$2" && shift 2 && exec "$@"'
        )
        return [
            "nsenter", f"--net=/run/netns/{self.namespace(i)}",
            "unshare", "--mount", "--uts", "sh", "-c", enter, self.hostnames[i],
            self._hosts_path(i), self.private_dir, *argv,
        ]  # fmt: skip

    def run(
        self, i: int, argv: Sequence[str], timeout: float = 30.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host ``i`` directly (no ssh) and wait; captures text output."""
        return subprocess.run(
            self.host_argv(i, argv), capture_output=True, text=True, timeout=timeout, check=check
        )

    def ssh_argv(self, i: int, command: str | Sequence[str]) -> list[str]:
        """The ssh command line running ``command`` on host ``i`` (a list is shell-quoted)."""
        if not isinstance(command, str):
            command = shlex.join(command)
        return ["ssh", *self.ssh_options, self.hosts[i], command]

    def ssh(
        self, i: int, command: str | Sequence[str], timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on host ``i`` through ssh and wait; captures text output."""
        return subprocess.run(
            self.ssh_argv(i, command),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def start_sshd(self, i: int) -> int:
        """Start host ``i``'s sshd (again, after kill_host(..., include_sshd=True)); its pid."""
        # sshd's privilege-separation directory; Debian's init script would
        # create it. Shared by every sshd, so it is left in place.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        old = self._sshd.get(i)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"host {i}'s sshd is running (pid {old.pid})")
        # -D: stay in the foreground, our child; -e: log to stderr, kept in the
        # temp dir. sshd gets a daemon's bare environment, not the test's.
        log = open(self._path(f"sshd{i}.log"), "ab")  # noqa: SIM115 (the child keeps it)
        with log:
            proc = subprocess.Popen(
                self.host_argv(i, [SSHD, "-D", "-e", "-f", self._path(f"sshd{i}_config")]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            )
        self._sshd[i] = proc
        _wait_for_ssh_banner(self.hosts[i], proc, self._path(f"sshd{i}.log"))
        return proc.pid

    def sshd_pid(self, i: int) -> int | None:
        """Host ``i``'s listening sshd, or None when it is not running."""
        proc = self._sshd.get(i)
        return proc.pid if proc is not None and proc.poll() is None else None

    # -- faults ---------------------------------------------------------------

    def pids(self, i: int) -> list[int]:
        """Every process in host ``i``'s network namespace (its sshd included)."""
        out = check(["ip", "netns", "pids", self.namespace(i)])
        found = [int(p) for p in out.split()]
        self._seen_pids.update(found)
        return found

    def cut_link(self, i: int) -> None:
        """Pull host ``i``'s cable: its packets are dropped both ways; connections hang."""
        check(["ip", "link", "set", self.veth(i), "down"])

    def restore_link(self, i: int) -> None:
        """Plug host ``i``'s cable back in."""
        check(["ip", "link", "set", self.veth(i), "up"])

    def kill_host(self, i: int, include_sshd: bool = False) -> list[int]:
        """SIGKILL every process on host ``i`` (all but its listening sshd unless
        ``include_sshd``); returns the pids killed, which are gone when it returns."""
        keep = None if include_sshd else self.sshd_pid(i)
        victims = [p for p in self.pids(i) if p != keep]
        # All at once, as a power cut: stopped first, so none of them (an agent
        # seeing its workers die) can report on the others before it goes too.
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        alive = kill_and_wait(victims)
        if i in self._sshd and include_sshd:
            self._sshd[i].wait(timeout=5)
        if alive:
            raise RuntimeError(f"host {i}: processes survived SIGKILL: {sorted(alive)}")
        return victims

    # -- cleanup --------------------------------------------------------------

    def close(self) -> None:
        """Kill every process on every host, remove namespaces, links and files.

        Raises RuntimeError naming whatever is left behind."""
        if self._closed:
            return
        self._closed = True
        self._unregister_close_at_exit()
        for i in range(self.n_hosts):
            with contextlib.suppress(CommandError):
                self.pids(i)
        survivors = kill_and_wait(self._seen_pids | {p.pid for p in self._sshd.values()})
        for proc in self._sshd.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        _remove_owner(self._owner)
        shutil.rmtree(self.workdir, ignore_errors=True)
        left = self.leftovers()
        left += [f"process {p}" for p in sorted(survivors)]
        if left:
            raise RuntimeError(f"NetnsCluster {self._owner} left behind: {', '.join(left)}")

    def leftovers(self) -> list[str]:
        """What of this cluster still exists: namespaces, links, files, processes."""
        left = [f"namespace {ns}" for ns in _namespaces() if ns.startswith(self._owner)]
        left += [f"link {name}" for name in _links() if name.startswith(f"mnb{self._tag}")]
        left += [self.workdir] if os.path.exists(self.workdir) else []
        left += [f"process {p}" for p in sorted(self._seen_pids) if pid_alive(p)]
        return left


def remove_stale_clusters() -> list[str]:
    """Remove the namespaces and bridges of clusters whose process is dead (a killed
    test run); returns their owner names."""
    stale = set()
    for ns in _namespaces():
        m = _NAMESPACE_RE.match(ns)
        if m and not pid_alive(int(m.group(1))):
            stale.add(f"mnb-{m.group(1)}-{m.group(2)}")
    for bridge, alias in _bridges_with_alias():
        m = re.match(r"^mnb-(\d+)-[0-9a-f]{6}$", alias)
        if bridge.startswith("mnb") and m and not pid_alive(int(m.group(1))):
            stale.add(alias)
    for owner in stale:
        pids = []
        for ns in _namespaces():
            if ns.startswith(f"{owner}-h"):
                with contextlib.suppress(CommandError):
                    pids += [int(p) for p in check(["ip", "netns", "pids", ns]).split()]
        kill_and_wait(pids)
        _remove_owner(owner)
        for path in _glob_dirs(tempfile.gettempdir(), f"{owner}-"):
            shutil.rmtree(path, ignore_errors=True)
    return sorted(stale)


def _remove_owner(owner: str) -> None:
    """Delete the namespaces and links (veths, bridge) named after ``owner``."""
    tag = owner.rsplit("-", 1)[1]
    for ns in _namespaces():
        if ns.startswith(f"{owner}-h"):
            # Deleting a namespace deletes its veth end, and so the pair.
            attempt(["ip", "netns", "del", ns])
    for name in _links():
        if name.startswith(f"mnb{tag}"):
            attempt(["ip", "link", "del", name])


def _namespaces() -> list[str]:
    try:
        out = check(["ip", "netns", "list"])
    except CommandError:
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    return [link["ifname"] for link in json.loads(check(["ip", "-j", "link", "show"]) or "[]")]


def _bridges_with_alias() -> list[tuple[str, str]]:
    links = json.loads(check(["ip", "-j", "link", "show", "type", "bridge"]) or "[]")
    return [(link["ifname"], link.get("ifalias", "")) for link in links]


def _root_addresses() -> list[str]:
    """The root namespace's global IPv4 addresses, but those of test clusters' bridges."""
    links = json.loads(check(["ip", "-j", "-4", "addr", "show", "scope", "global"]) or "[]")
    return [
        a["local"]
        for link in links
        if not link["ifname"].startswith("mnb")
        for a in link.get("addr_info", [])
    ]


def _glob_dirs(parent: str, prefix: str) -> list[str]:
    try:
        return [os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(prefix)]
    except FileNotFoundError:
        return []


def _free_subnet(tag: str) -> ipaddress.IPv4Network:
    """A /24 in 10.200-249.x.0 that no address or route of the root namespace overlaps.

    Starts from a point derived from ``tag`` so that parallel runs spread out."""
    used = [
        ipaddress.ip_network(route["dst"], strict=False)
        for route in json.loads(check(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]")
        if route.get("dst") not in (None, "default")
    ]
    used += [
        ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
        for link in json.loads(check(["ip", "-j", "-4", "addr", "show"]) or "[]")
        for a in link.get("addr_info", [])
    ]
    n_candidates = len(_SUBNET_FIRST_OCTETS) * 256
    start = int(tag, 16) % n_candidates
    for k in range(n_candidates):
        index = (start + k) % n_candidates
        first, second = _SUBNET_FIRST_OCTETS[index // 256], index % 256
        subnet = ipaddress.IPv4Network(f"10.{first}.{second}.0/24")
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise RuntimeError("no free 10.200-249.x.0/24 subnet")


def _keygen(path: str, comment: str) -> None:
    check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


def _wait_for_ssh_banner(address: str, proc: subprocess.Popen[bytes], log_path: str) -> None:
    """Wait until the sshd at ``address`` greets; raise with its log if it died or stays mute."""
    deadline = time.monotonic() + SSHD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with socket.create_connection((address, 22), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.02)
    else:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with open(log_path, errors="replace") as f:
        log = f.read()[-2000:]
    raise RuntimeError(f"sshd on {address} did not start (exit {proc.poll()}): {log}")
