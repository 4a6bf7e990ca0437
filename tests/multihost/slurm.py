"""A SLURM cluster on this machine, from Debian's slurm-wlm, started and removed by a test.

``SlurmCluster()`` runs munged, slurmctld and one slurmd (node = this machine)
with a per-cluster munge key, slurm.conf, ports and directories.
``SlurmCluster(hosts)`` puts one slurmd on each host of a ``NetnsCluster``
instead: node ``host<i>`` at that namespace's address, slurmctld at the
controller address, so ``srun -N2`` runs its tasks on two different "hosts".

Clients (srun, sbatch, salloc, squeue, scancel) need only ``SLURM_CONF``:
``subprocess.run(["srun", ...], env={**os.environ, **slurm.env})``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

from cluster import NetnsCluster
from system import ClosedOnExit, check, kill_and_wait, pid_alive, root_and_tools_reason

SLURM_TOOLS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "srun", "sinfo")
# Every daemon gets this variable; slurmstepd inherits it from slurmd, and job
# tasks get SLURM_CONF from srun: together they find everything a cluster ran.
_MARK = "MONARCH_NB_SLURM_CLUSTER"
NODES_UP_TIMEOUT_S = 90.0  # only catches a hang: a loaded machine starts slurmd slowly
PARTITION = "debug"


def slurm_unavailable_reason() -> str | None:
    """Why a SlurmCluster cannot run on this machine, or None if it can."""
    return root_and_tools_reason(SLURM_TOOLS, "the test SLURM daemons (run as root)")


class SlurmCluster(ClosedOnExit):
    """munged + slurmctld + slurmd(s) with per-cluster config; a context manager."""

    def __init__(self, hosts: NetnsCluster | None = None) -> None:
        self.hosts = hosts
        self._tag = secrets.token_hex(4)
        self._daemons: list[subprocess.Popen[bytes]] = []
        self._closed = False
        self.workdir = tempfile.mkdtemp(prefix=f"mnb-slurm-{os.getpid()}-{self._tag}-")
        # munged refuses a socket in a directory others cannot search (0700).
        os.chmod(self.workdir, 0o755)
        self.conf_path = os.path.join(self.workdir, "slurm.conf")
        self.partition = PARTITION
        self.env = {"SLURM_CONF": self.conf_path}
        if hosts is None:
            self.nodes = [socket.gethostname()]
            self._node_addresses = ["127.0.0.1"]
            self._controller_address = "127.0.0.1"
        else:
            self.nodes = list(hosts.hostnames)
            self._node_addresses = list(hosts.hosts)
            self._controller_address = hosts.controller_address
        self._register_close_at_exit()
        try:
            remove_stale_slurm_clusters()
            self._write_config()
            self._start_daemons()
            self.wait_for_nodes_idle()
        except BaseException:
            self.close()
            raise

    def _path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    def _write_config(self) -> None:
        check(["mungekey", "--create", f"--keyfile={self._path('munge.key')}"])
        os.makedirs(self._path("state"))
        for node in self.nodes:
            # slurmd's spool (%n: the node name) must exist before it starts.
            os.makedirs(self._path(f"spool/{node}"))
        # In one namespace, ports must not collide with a parallel run's; a
        # node in its own namespace has the port to itself.
        ctld_port = _free_port()
        slurmd_port = _free_port() if self.hosts is None else 6818
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={address} CPUs={os.cpu_count()} RealMemory=500"
            for name, address in zip(self.nodes, self._node_addresses, strict=True)
        )
        with open(self.conf_path, "w") as f:
            f.write(f"""\
ClusterName=mnb{self._tag}
SlurmctldHost={socket.gethostname()}({self._controller_address})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self._path("munge.sock")}
StateSaveLocation={self._path("state")}
SlurmdSpoolDir={self._path("spool/%n")}
SlurmctldPidFile={self._path("slurmctld.pid")}
SlurmdPidFile={self._path("slurmd-%n.pid")}
SlurmctldLogFile={self._path("slurmctld.log")}
SlurmdLogFile={self._path("slurmd-%n.log")}
# No cgroups (none to delegate in a container): processes tracked through /proc.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
# A node that comes back (after kill_host + restart) is usable again at once.
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=5
KillWait=2
{nodes}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _daemon_env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "SLURM_CONF": self.conf_path,
            _MARK: self._tag,
        }

    def _spawn(self, argv: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        # -D / --foreground: our children, reaped by us; their stderr kept in the temp dir.
        with open(self._path(log_name), "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._daemon_env(),
            )
        self._daemons.append(proc)
        return proc

    def _start_daemons(self) -> None:
        munge_socket = self._path("munge.sock")
        self._spawn(
            [
                "/usr/sbin/munged", "--foreground",
                f"--socket={munge_socket}",
                f"--key-file={self._path('munge.key')}",
                f"--pid-file={self._path('munged.pid')}",
                f"--log-file={self._path('munged.log')}",
                f"--seed-file={self._path('munged.seed')}",
            ],
            "munged.out",
        )  # fmt: skip
        _wait_for(lambda: os.path.exists(munge_socket), "munged's socket", self._path("munged.out"))
        # -i: ignore (absent) state files; the state dir is new.
        self._spawn(["/usr/sbin/slurmctld", "-D", "-i"], "slurmctld.out")
        for i in range(len(self.nodes)):
            self.start_slurmd(i)

    def start_slurmd(self, i: int) -> None:
        """Start node ``i``'s slurmd (again, after NetnsCluster.kill_host(i) killed it);
        returns at once: the node is back when sinfo says it is idle."""
        node = self.nodes[i]
        argv = ["/usr/sbin/slurmd", "-D", "-N", node]
        if self.hosts is not None:
            # A slurmd on host i: its namespace (reaching the munge socket
            # through the shared filesystem) and its hostname.
            argv = self.hosts.host_argv(i, argv)
        self._spawn(argv, f"slurmd-{node}.out")

    def node_states(self) -> dict[str, str]:
        """node -> its state as sinfo abbreviates it ("idle", "alloc", "down*", ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=True).stdout
        return dict(line.split() for line in out.splitlines())

    def wait_for_nodes_idle(self, timeout: float = NODES_UP_TIMEOUT_S) -> None:
        """Wait until every node is idle (up, registered, running nothing)."""
        seen: dict[str, str] = {}

        def all_idle() -> bool:
            try:
                seen.update(self.node_states())
            except subprocess.SubprocessError:
                return False
            return set(seen.values()) == {"idle"}

        _wait_for(
            all_idle, "every node idle", self._path("slurmctld.log"), timeout, lambda: f"{seen}"
        )

    def restart_slurmd(self, i: int, timeout: float = NODES_UP_TIMEOUT_S) -> None:
        """Start node ``i``'s slurmd again (after NetnsCluster.kill_host(i)) and
        return once slurmctld has its registration and the node is idle.

        The event is the node's SlurmdStartTime moving past the one before: the
        controller may not even have noticed the kill (SlurmdTimeout), so "idle"
        alone can be the dead slurmd's state.
        """
        node = self.nodes[i]
        before = self._slurmd_start_time(node)
        # SlurmdStartTime counts whole seconds: start in a later one than before.
        _wait_for(lambda: time.time() >= before + 1, "the clock", self._path("slurmctld.log"))
        self.start_slurmd(i)
        state = {"start": before, "state": ""}

        def registered_and_idle() -> bool:
            try:
                fields = self._node_fields(node)
            except subprocess.SubprocessError:
                return False
            state["start"] = _epoch(fields["SlurmdStartTime"])
            state["state"] = fields["State"]
            return state["start"] > before and state["state"] == "IDLE"

        _wait_for(
            registered_and_idle,
            f"{node}'s restarted slurmd to register and the node to be idle",
            self._path("slurmctld.log"),
            timeout,
            lambda: f"{node}: {state}, SlurmdStartTime before the restart {before}",
        )

    def _node_fields(self, node: str) -> dict[str, str]:
        out = self.run(["scontrol", "-o", "show", "node", node], check=True).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def _slurmd_start_time(self, node: str) -> float:
        return _epoch(self._node_fields(node)["SlurmdStartTime"])

    def run(
        self, argv: Sequence[str], timeout: float = 60.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command (srun, sbatch, ...) against this cluster."""
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
        )

    def pids(self) -> list[int]:
        """Every live process of this cluster: daemons, slurmstepd, job tasks."""
        needles = {f"{_MARK}={self._tag}", f"SLURM_CONF={self.conf_path}"}
        return [pid for pid, environ in _environs() if needles & environ]

    def close(self) -> None:
        """Stop every daemon and job of this cluster, remove its files; raises
        RuntimeError naming what is left."""
        if self._closed:
            return
        self._closed = True
        self._unregister_close_at_exit()
        for proc in self._daemons:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        # slurmd and slurmctld exit within ~1 s of SIGTERM; whatever has not
        # (and every slurmstepd and task) is killed.
        deadline = time.monotonic() + 3
        while any(p.poll() is None for p in self._daemons) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = kill_and_wait(self.pids() + [p.pid for p in self._daemons if p.poll() is None])
        for proc in self._daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)
        left = [f"process {p}" for p in sorted(survivors | set(self.pids()))]
        if os.path.exists(self.workdir):
            left.append(self.workdir)
        if left:
            raise RuntimeError(f"SlurmCluster {self._tag} left behind: {', '.join(left)}")


def remove_stale_slurm_clusters() -> list[int]:
    """Kill the processes of clusters whose test process is dead (a killed run left
    them) and remove their directories; returns the pids killed."""
    stale: set[int] = set()
    for pid, environ in _environs():
        for var in environ:
            # SLURM_CONF=<tmp>/mnb-slurm-<owner pid>-<tag>-<random>/slurm.conf
            m = re.match(r"SLURM_CONF=.*/mnb-slurm-(\d+)-[0-9a-f]{8}-[^/]*/slurm\.conf$", var)
            if m and not pid_alive(int(m.group(1))):
                stale.add(pid)
    kill_and_wait(stale)
    for name in os.listdir(tempfile.gettempdir()):
        m = re.match(r"mnb-slurm-(\d+)-", name)
        if m and not pid_alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)
    return sorted(stale)


def _environs() -> Iterator[tuple[int, set[str]]]:
    """(pid, environment as {"NAME=value"}) of every live process but this one."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = set(f.read().decode(errors="replace").split("\0"))
        except OSError:
            continue
        if pid_alive(int(entry)):
            yield int(entry), environ


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _epoch(timestamp: str) -> float:
    """Seconds since the epoch of a SLURM time (``2026-11-24T06:34:42``, local time)."""
    return time.mktime(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%S"))


ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "artifacts")


def _wait_for(
    ready: Callable[[], bool],
    what: str,
    log_path: str,
    timeout: float = 10.0,
    last_seen: Callable[[], str] | None = None,
) -> None:
    """Poll ``ready()`` until true, or raise a one-line error on timeout.

    The error says what was last seen and where a copy of ``log_path`` is kept
    (tests/artifacts/, which outlives the cluster's temporary directory); the
    log's tail goes to stderr, which pytest shows beside the failure.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    os.makedirs(ARTIFACTS, exist_ok=True)
    kept = os.path.join(
        os.path.abspath(ARTIFACTS), f"{time.strftime('%Y%m%dT%H%M%S')}-{os.path.basename(log_path)}"
    )
    try:
        shutil.copyfile(log_path, kept)
        with open(log_path, errors="replace") as f:
            print(
                f"--- the last lines of {log_path}:", *f.readlines()[-20:], sep="", file=sys.stderr
            )
    except OSError as exc:
        kept = f"(no log: {exc})"
    seen = f" (last seen: {last_seen()})" if last_seen is not None else ""
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}{seen}; log: {kept}")
