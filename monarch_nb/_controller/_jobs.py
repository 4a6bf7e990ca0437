"""Jobs, as Monarch's ``monarch.job``: a spec, ``apply()``, ``state()``, ``kill()``.

A job starts host agents that outlive the kernel: each listens
(``monarch-nb agent --listen``) with the keys of one key file (mode 0600),
and ``state()`` reaches them with ``attach``. What a restarted kernel needs
to find them again (the spec, the agents' addresses and pids) is saved as
JSON beside the key file; no secret is in it. ``state()`` on a job whose
saved twin is running re-attaches instead of starting new agents.

::

    job = ProcessJob(meshes={"trainers": 2})      # or SSHJob, SlurmJob, KubernetesJob
    trainers = job.state().trainers               # a HostMesh of 2 hosts
    procs = trainers.spawn_procs(per_host={"procs": 4})
    job.kill()
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._common import _keys
from .._common._errors import MeshUsageError
from .._common._network import free_port
from .._common._pids import pid_alive
from ._launchers import attach, host_prelude
from ._proc_mesh import HostMesh, this_host
from ._process_group import START_TIMEOUT_S

DEFAULT_JOB_PATH = ".monarch_nb/job_state.json"
# Agents this process started: kept so they are reaped, not warned about.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_AGENT = ("-m", "monarch_nb.agent")


class JobState:
    """One ``HostMesh`` per named mesh of a job, as attributes (``state.trainers``)."""

    def __init__(self, hosts: Mapping[str, HostMesh]) -> None:
        self._hosts = dict(hosts)

    def __getattr__(self, name: str) -> HostMesh:
        try:
            return self.__dict__["_hosts"][name]
        except KeyError:
            known = ", ".join(sorted(self.__dict__.get("_hosts", ())))
            raise AttributeError(f"this job has no mesh {name!r}; its meshes: {known}") from None

    def __getitem__(self, name: str) -> HostMesh:
        return getattr(self, name)

    def __iter__(self):
        return iter(self._hosts)

    def __repr__(self) -> str:
        return f"JobState({self._hosts!r})"


def _meshes(meshes: Mapping[str, int], what: str) -> dict[str, int]:
    out = dict(meshes)
    if not out:
        raise MeshUsageError(f"{what}(meshes=...) needs at least one mesh, e.g. {{'hosts': 2}}")
    for name, count in out.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise MeshUsageError(f"{what}: mesh name {name!r} must be a Python name")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise MeshUsageError(
                f"{what}: mesh {name!r} needs a positive host count, got {count!r}"
            )
    return out


_KINDS: dict[str, type[JobTrait]] = {}


class JobTrait:
    """A job: its spec (constructor arguments), and once applied, its running agents.

    Subclasses say how agents start (``_create`` fills ``self._running``
    with ``{"meshes": {name: [address, ...]}, ...}``) and stop (``_kill``).
    """

    kind = "job"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.kind] = cls  # job_load finds it by the "kind" saved with it

    def __init__(self) -> None:
        self._running: dict[str, Any] | None = None
        self._state: JobState | None = None
        self._path: str | None = None

    # -- spec ------------------------------------------------------------------

    def spec(self) -> dict[str, Any]:
        """The constructor arguments: what makes two jobs the same job."""
        raise NotImplementedError

    def can_run(self, other: JobTrait) -> bool:
        """Whether this running job serves ``other``'s spec."""
        return type(other) is type(self) and other.spec() == self.spec()

    # -- lifecycle ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._running is not None

    def apply(self, cached_path: str | None = DEFAULT_JOB_PATH) -> None:
        """Start the job's agents unless it runs already; save it at ``cached_path``."""
        if self._running is not None:
            return
        key_file = _key_file_for(cached_path)
        self._running = {"key_file": key_file, **self._create(key_file)}
        if cached_path is not None:
            self.dump(cached_path)

    def state(
        self, cached_path: str | None = DEFAULT_JOB_PATH, timeout: float | None = 60.0
    ) -> JobState:
        """One HostMesh per named mesh; applies the job, or re-attaches to the
        running job saved at ``cached_path`` when it has this spec."""
        if self._state is not None:
            return self._state
        if self._running is None and cached_path is not None and os.path.exists(cached_path):
            saved = job_load(cached_path)
            if saved.active and saved.can_run(self) and saved._alive():
                self._running = saved._running
            elif saved.active:
                saved._kill()
        self.apply(cached_path)
        self._path = cached_path
        self._state = JobState(self._connect(timeout))
        return self._state

    def kill(self) -> None:
        """Stop the job's agents (and every process they run); forget the saved state."""
        if self._state is not None:
            for hosts in self._state._hosts.values():
                hosts.shutdown()
            self._state = None
        if self._running is not None:
            self._kill()
            self._running = None
        if self._path and os.path.exists(self._path):
            os.remove(self._path)

    # -- saved state ------------------------------------------------------------

    def dump(self, path: str) -> None:
        """Save spec and running state as JSON (no secrets: the keys stay in their file)."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        record = {"kind": self.kind, "spec": self.spec(), "running": self._running}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)

    # -- per launcher -----------------------------------------------------------

    def _create(self, key_file: str) -> dict[str, Any]:
        raise NotImplementedError

    def _kill(self) -> None:
        raise NotImplementedError

    def _alive(self) -> bool:
        return True

    def _connect(self, timeout: float | None) -> dict[str, HostMesh]:
        assert self._running is not None
        key_file = self._running["key_file"]
        return {
            name: _attach_when_listening(addresses, key_file, timeout)
            for name, addresses in self._running["meshes"].items()
        }


class LocalJob(JobTrait):
    """This host under each name: ``state().hosts`` is ``this_host()`` (nothing starts)."""

    kind = "local"

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self.hosts = list(hosts)

    def spec(self) -> dict[str, Any]:
        return {"hosts": self.hosts}

    def state(self, cached_path: str | None = None, timeout: float | None = 60.0) -> JobState:
        self._running = {"meshes": {}}
        self._state = JobState({name: this_host() for name in self.hosts})
        return self._state

    def _kill(self) -> None:
        pass


class ProcessJob(JobTrait):
    """Agents as local processes, one per host of each mesh, that survive the kernel.

    For trying a multi-host program on one machine, and for a kernel restart
    that re-attaches (``state()`` again in the new kernel).
    """

    kind = "process"

    def __init__(self, meshes: Mapping[str, int] | None = None, *, python: str | None = None):
        super().__init__()
        self.meshes = _meshes(meshes or {"hosts": 1}, "ProcessJob")
        self.python = python or sys.executable

    def spec(self) -> dict[str, Any]:
        return {"meshes": self.meshes, "python": self.python}

    def _create(self, key_file: str) -> dict[str, Any]:
        meshes: dict[str, list[str]] = {}
        pids: list[int] = []
        for name, count in self.meshes.items():
            meshes[name] = []
            for index in range(count):
                address = f"tcp://127.0.0.1:{_free_port()}"
                argv = [self.python, *_AGENT, "--listen", address, "--key-file", key_file]
                proc = subprocess.Popen(
                    [*argv, "--host-index", str(index)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # outlives the kernel; kill() ends it
                )
                meshes[name].append(address)
                pids.append(proc.pid)
                _CHILDREN[proc.pid] = proc
        return {"meshes": meshes, "pids": pids}

    def _alive(self) -> bool:
        return all(pid_alive(pid) for pid in (self._running or {}).get("pids", ()))

    def _kill(self) -> None:
        for pid in (self._running or {}).get("pids", ()):
            _terminate(pid)


class SSHJob(JobTrait):
    """Agents started over ssh on ``hosts``, detached so they outlive the kernel.

    ``meshes`` splits the hosts in order (default: all under ``"hosts"``);
    Monarch's form works too: ``SSHJob(python_exe=, ssh_args=)`` then
    ``job.add_mesh("trainers", ["node1", "node2"])``. The key file reaches
    each host on ssh's stdin (written there mode 0600, removed by ``kill()``);
    each agent listens on its host's name as ssh was given it. ``python`` (an
    interpreter or a venv's directory on the hosts) and ``env_setup`` (shell
    commands run before the agent, e.g. ``"source /opt/env.sh"``) as for
    :func:`~monarch_nb.ssh_hosts`.
    """

    kind = "ssh"

    def __init__(
        self,
        hosts: Sequence[str] = (),
        meshes: Mapping[str, int] | None = None,
        *,
        python: str | None = None,
        env_setup: str | None = None,
        ssh: Sequence[str] = ("ssh", "-T", "-o", "BatchMode=yes"),
        ssh_options: Sequence[str] = (),
        python_exe: str | None = None,
        ssh_args: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.hosts = [hosts] if isinstance(hosts, str) else list(hosts)
        self.meshes: dict[str, int] = {}
        if self.hosts:
            self.meshes = _meshes(meshes or {"hosts": len(self.hosts)}, "SSHJob")
        elif meshes:
            raise MeshUsageError("SSHJob(meshes=...) needs hosts=[...] to split among them")
        if sum(self.meshes.values()) != len(self.hosts):
            raise MeshUsageError(
                f"SSHJob: meshes {self.meshes} count {sum(self.meshes.values())} hosts, "
                f"hosts= names {len(self.hosts)}"
            )
        self.python = python or python_exe or sys.executable
        self.env_setup = env_setup
        self.ssh = list(ssh)
        self.ssh_options = [*ssh_options, *ssh_args]

    def add_mesh(self, name: str, hosts: Sequence[str]) -> None:
        """Monarch's way to name a mesh: its hosts, after those added before."""
        if self._running is not None:
            raise MeshUsageError("SSHJob.add_mesh: the job is applied already; kill() it first")
        self.meshes = {**self.meshes, **_meshes({name: len(hosts)}, "SSHJob.add_mesh")}
        self.hosts += list(hosts)

    def spec(self) -> dict[str, Any]:
        return {
            "hosts": self.hosts,
            "meshes": self.meshes,
            "python": self.python,
            "env_setup": self.env_setup,
            "ssh": self.ssh,
            "ssh_options": self.ssh_options,
        }

    def _remote_start(self, host: str, index: int, remote_key: str) -> str:
        name = host.rpartition("@")[2]
        free = "from monarch_nb._common._network import free_port; print(free_port())"
        listen = f"tcp://{name}:$PORT"
        # env_setup first: if it fails, the key (on stdin) is never written there.
        return (
            host_prelude(self.python, self.env_setup)
            + f"umask 077; mkdir -p $(dirname {remote_key}); cat > {remote_key}; "
            + f'PORT=$("$p" -c {shlex.quote(free)}); '
            f'setsid nohup "$p" -m monarch_nb.agent --listen {listen} '
            f"--key-file {remote_key} --host-index {index} </dev/null >/dev/null 2>&1 & "
            'echo "$PORT $!"'
        )

    def _create(self, key_file: str) -> dict[str, Any]:
        if not self.hosts:
            raise MeshUsageError("SSHJob has no hosts: SSHJob(hosts=[...]) or job.add_mesh()")
        with open(key_file, "rb") as f:
            key = f.read()
        remote_key = f".monarch_nb/agent-{os.path.basename(key_file)}"
        meshes: dict[str, list[str]] = {}
        pids: dict[str, int] = {}
        hosts = iter(self.hosts)
        for name, count in self.meshes.items():
            meshes[name] = []
            for index in range(count):
                host = next(hosts)
                argv = [
                    *self.ssh,
                    *self.ssh_options,
                    host,
                    self._remote_start(host, index, remote_key),
                ]
                done = subprocess.run(argv, input=key, capture_output=True, timeout=120)
                if done.returncode != 0:
                    self._running = {"pids": pids, "remote_key": remote_key}
                    self._kill()
                    raise MeshUsageError(
                        f"SSHJob: starting the agent on {host!r} failed "
                        f"({done.returncode}): {done.stderr.decode(errors='replace').strip()}"
                    )
                port, pid = done.stdout.split()[-2:]
                meshes[name].append(f"tcp://{host.rpartition('@')[2]}:{int(port)}")
                pids[host] = int(pid)
        return {"meshes": meshes, "pids": pids, "remote_key": remote_key}

    def _kill(self) -> None:
        running = self._running or {}
        remote_key = shlex.quote(running.get("remote_key", ""))
        for host, pid in running.get("pids", {}).items():
            stop = f"kill {int(pid)}; rm -f {remote_key}"
            argv = [*self.ssh, *self.ssh_options, host, stop]
            subprocess.run(argv, capture_output=True, timeout=60, check=False)


def job_load(path: str = DEFAULT_JOB_PATH) -> JobTrait:
    """The job saved at ``path`` (by ``apply``/``state``), running state included."""
    with open(path) as f:
        record = json.load(f)
    cls = _KINDS.get(record.get("kind"))
    if cls is None:
        raise MeshUsageError(f"{path}: unknown job kind {record.get('kind')!r}")
    job = cls(**record["spec"])
    job._running = record.get("running")
    job._path = path
    return job


# -- helpers ------------------------------------------------------------------------


def _key_file_for(cached_path: str | None) -> str:
    """A fresh 0600 key file beside the saved state (or in the run's private dir)."""
    if cached_path is None:
        from .._common._rundir import run_dir

        base = run_dir()
    else:
        base = os.path.dirname(os.path.abspath(cached_path))
        os.makedirs(base, mode=0o700, exist_ok=True)
    path = os.path.join(base, f"job-{os.urandom(6).hex()}.key")
    _keys.write_key_file(path)
    return path


def _free_port() -> int:
    return free_port("127.0.0.1")


def _terminate(pid: int, grace: float = 10.0) -> None:
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        child.terminate()
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _attach_when_listening(addresses: list[str], key_file: str, timeout: float | None) -> HostMesh:
    from urllib.parse import urlsplit

    deadline = time.monotonic() + (START_TIMEOUT_S if timeout is None else timeout)
    for address in addresses:  # an agent binds a moment after it starts
        parts = urlsplit(address)
        while True:
            try:
                with socket.create_connection((parts.hostname, parts.port or 0), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise MeshUsageError(
                        f"no agent listens at {address} after {timeout} s"
                    ) from None
                time.sleep(0.1)
    return attach(addresses, key_file=key_file, timeout=max(1.0, deadline - time.monotonic()))
