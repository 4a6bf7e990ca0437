"""Jobs, as Monarch's ``monarch.job``: a spec, ``apply()``, ``state()``, ``kill()``.

A job starts host agents that outlive the kernel: each listens
(``monarch-nb agent --listen``) with the keys of one key file (mode 0600),
and ``state()`` reaches them with ``attach``. What a restarted kernel needs
to find them again (the spec, the agents' addresses and pids) is saved as
JSON beside the key file; no secret is in it. ``state()`` on a job whose
saved twin is running re-attaches instead of starting new agents.

The saved file is data, never code (``_state_file``): it must be ours and
writable by nobody else; its running state is used only when its spec is the
caller's, with the caller's own launcher; a pid in it is signalled only when
it is provably the agent that was saved (boot, start time, command line).

::

    job = ProcessJob(meshes={"trainers": 2})      # or SSHJob, SlurmJob, KubernetesJob
    trainers = job.state().trainers               # a HostMesh of 2 hosts
    procs = trainers.spawn_procs(per_host={"procs": 4})
    job.kill()
"""

from __future__ import annotations

import os
import pickle
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .._controller._proc_mesh import HostMesh
from .._controller._process_group import START_TIMEOUT_S
from .._model._errors import MeshUsageError
from .._services import _config
from .._wire import _keys
from .._wire._network import free_port
from . import _state_file
from ._admin import MeshAdminConfig, note_admin_requested
from ._launchers import attach, host_prelude
from ._monarch_subclass import refuse_monarch_create
from ._telemetry import TelemetryConfig, note_telemetry_requested

DEFAULT_JOB_PATH = ".monarch_nb/job_state.json"
# Where a job written to Monarch's contract (below) is saved by default: a pickle, as Monarch's.
_PICKLED_JOB_PATH = ".monarch_nb/job_state.pkl"
# Set in a client script a job launched (apply(client_script=...)): where the
# launching job is saved. That script's job.state() answers the launcher's meshes.
BATCH_JOB_ENV = "MONARCH_NB_BATCH_JOB"
# Agents this process started: kept so they are reaped, not warned about.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_AGENT = ("-m", "monarch_nb.agent")
# Names of what a job saves beside its state file, so a loaded file can point nowhere else.
_KEY_NAME = re.compile(r"job-[0-9a-f]{12}\.key")
_REMOTE_KEY = re.compile(r"\.monarch_nb/agent-job-[0-9a-f]{12}\.key")
_LOCAL_AGENT = re.compile(r"tcp://127\.0\.0\.1:[0-9]{1,5}")


class JobState:
    """One ``HostMesh`` per named mesh of a job, as attributes (``state.trainers``)."""

    # Monarch's telemetry and admin endpoints: monarch_nb runs neither service.
    query_engine = query_engine_client = telemetry_url = dashboard_url = admin_url = None

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

    Two ways to write one:

    - Monarch's: ``_create(client_script)`` brings the job into existence
      (its return value is ignored), ``_state()`` returns the ``JobState``,
      ``_kill()`` stops it, ``can_run(spec)`` says whether a saved job serves
      another. Such a job is saved as a pickle (``dump``/``dumps``, as
      Monarch's), read back only from a file of yours nobody else may write.
    - ours: ``spec()``, and ``_create(key_file)`` returning
      ``{"meshes": {name: [address, ...]}, ...}`` (agents listening there),
      ``_kill()``; saved as JSON, data and never code.

    A subclass that defines ``_state`` is written Monarch's way.
    """

    kind = "job"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            _KINDS[cls.kind] = cls  # job_load finds it by the "kind" saved with it

    def __init__(self) -> None:
        self._running: dict[str, Any] | None = None
        self._connected: JobState | None = None
        self._path: str | None = None
        self._via: JobTrait | None = None  # the saved job a Monarch-style one re-attached to

    def __getstate__(self) -> dict[str, Any]:
        # A pickled job (Monarch's contract) carries its spec and running
        # state, never connections (host meshes) of this process.
        return {k: v for k, v in self.__dict__.items() if k != "_connected"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._connected = None

    @classmethod
    def _monarch_style(cls) -> bool:
        """Whether this job is written to Monarch's contract (it defines ``_state``)."""
        return cls._state is not JobTrait._state

    # -- spec ------------------------------------------------------------------

    def spec(self) -> dict[str, Any]:
        """The constructor arguments: what makes two jobs the same job."""
        raise NotImplementedError

    def enable_admin(self, config: MeshAdminConfig | None = None, **kwargs: Any) -> JobTrait:
        """Monarch's: configure its mesh admin server. Accepted; none runs here (a
        warning says so once; see :mod:`monarch_nb._jobs._admin`). Returns the job."""
        self.admin_config = config if config is not None else MeshAdminConfig(**kwargs)
        note_admin_requested(self.admin_config)
        return self

    def enable_telemetry(
        self,
        config: TelemetryConfig | None = None,
        *,
        mesh_admin_config: MeshAdminConfig | None = None,
        **kwargs: Any,
    ) -> JobTrait:
        """Monarch's: start its telemetry sidecar at ``state()``. Accepted; none runs
        here (a warning says so once; see :mod:`monarch_nb._jobs._telemetry`).
        Returns the job."""
        self.telemetry_config = config if config is not None else TelemetryConfig(**kwargs)
        note_telemetry_requested(self.telemetry_config)
        if mesh_admin_config is not None:
            self.enable_admin(mesh_admin_config)
        return self

    def can_run(self, other: JobTrait) -> bool:
        """Whether this running job serves ``other``'s spec (a job written to
        Monarch's contract says so itself; by default it serves none)."""
        if self._monarch_style():
            return False
        return type(other) is type(self) and other.spec() == self.spec()

    # -- lifecycle ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._running is not None

    @property
    def apply_id(self) -> str | None:
        """An id of this allocation, made fresh by each ``apply()`` that starts the job
        (kept by ``dump``/``job_load``); None before. As Monarch's."""
        if self._via is not None:
            return self._via.apply_id
        return None if self._running is None else self.__dict__.get("_apply_id")

    def apply(
        self, client_script: str | None = None, *, cached_path: str | None = DEFAULT_JOB_PATH
    ) -> None:
        """Start the job unless it runs already (then nothing happens).

        ``client_script``, as Monarch's: a job that can (``LocalJob``) also
        runs that script as the job's client. A job written to our contract
        starts its agents and saves itself at ``cached_path``.
        """
        if self._running is not None:
            return
        self._apply_id = str(uuid.uuid4())
        if self._monarch_style():
            created = self._create(client_script)  # type: ignore[arg-type]
            self._running = created if isinstance(created, dict) else {}
            return
        if client_script is not None:
            raise MeshUsageError(
                f"{type(self).__name__}.apply(client_script={client_script!r}): this job "
                "cannot run a client script; apply() it, then run the script yourself "
                "(its job.state() re-attaches), or use LocalJob(...).apply(client_script=...)"
            )
        refuse_monarch_create(self)
        key_file = _key_file_for(cached_path)
        self._running = {"key_file": key_file, **self._create(key_file)}
        if cached_path is not None:
            self.dump(cached_path)

    def state(
        self, cached_path: str | None = DEFAULT_JOB_PATH, timeout: float | None = 60.0
    ) -> JobState:
        """One HostMesh per named mesh; applies the job, or re-attaches to the
        running job saved at ``cached_path`` when it has this spec.

        The saved file is trusted only for where this job's agents are: it must
        be yours and writable by nobody else (``PermissionError`` otherwise), and
        a file saved with another spec is never acted on with its own commands
        (``MeshUsageError``, unless its agents are local and provably its own:
        those are stopped).
        """
        if self._monarch_style():
            return self._monarch_job_state(cached_path)
        if self._connected is not None:
            # A new handle per call, as Monarch's: its stop() stops only its meshes.
            return JobState({n: h._new_handle() for n, h in self._connected._hosts.items()})
        if self._running is None and cached_path is not None:
            self._adopt_saved(cached_path)
        self.apply(cached_path=cached_path)
        self._path = cached_path
        self._connected = JobState(self._connect(timeout))
        return self._connected

    def _monarch_job_state(self, cached_path: str | None) -> JobState:
        """``state()`` of a job written to Monarch's contract: its own ``_state()`` once
        applied, or a saved job's that ``can_run`` this one (one that cannot is
        killed and its file removed, as Monarch's)."""
        if cached_path == DEFAULT_JOB_PATH:
            cached_path = _PICKLED_JOB_PATH
        if self._via is None and os.environ.get(BATCH_JOB_ENV):
            # A client script a job launched (batch mode): its state() is that job's.
            launcher = _load_pickled(os.environ[BATCH_JOB_ENV])
            if launcher is None:
                raise MeshUsageError(
                    f"{BATCH_JOB_ENV}={os.environ[BATCH_JOB_ENV]!r} names no saved job: "
                    "this script was started as a job's client_script, but that job's "
                    "state is gone; unset the variable to run the script on its own"
                )
            self._via = launcher
        if self._via is not None:
            return self._via._state()
        if self._running is not None:
            return self._state()
        saved = _load_pickled(cached_path) if cached_path is not None else None
        if saved is not None and saved._running is not None:
            if saved.can_run(self):
                self._via = saved
                return saved._state()
            try:
                saved._kill()
            except NotImplementedError:
                pass
            assert cached_path is not None
            _state_file.remove(cached_path, sticky_ok=True)
        self.apply()
        state = self._state()
        if cached_path is not None:
            self.dump(cached_path)
        return state

    def _adopt_saved(self, path: str) -> None:
        """Re-attach to the job saved at ``path`` if it is this one and alive; stop it if
        it is this one and partly dead. Nothing in the file is ever run."""
        record = _state_file.read(path)
        if record is None or record.get("running") is None:
            return
        running = record["running"]
        if record.get("kind") == self.kind and record.get("spec") == self.spec():
            problem = self._running_problem(running, path)
            if problem:
                raise MeshUsageError(
                    f"{path!r} has this job's spec but not a running state monarch_nb "
                    f"wrote ({problem}); remove it"
                )
            self._running = running
            if self._alive():
                return
            self._kill()
            self._running = None
        elif record.get("kind") == ProcessJob.kind and isinstance(running, dict):
            # Local agents need no command to stop: those still provably the
            # saved ones (boot, start time, command line) are signalled.
            for agent in _saved_agents(running):
                _stop_agent(agent)
        else:
            raise MeshUsageError(
                f"{path!r} holds a {record.get('kind')!r} job with another spec than this "
                f"{self.kind!r} job ({record.get('spec')!r}); commands saved in it are never "
                f"run. If that job is yours, stop it with the job that started it "
                f"(job_load({path!r}).kill() runs the commands of the spec shown: check them "
                f"first); or pass another cached_path=, or remove the file"
            )

    def _running_problem(self, running: Any, path: str) -> str:
        """What makes ``running`` (from the file at ``path``) unlike what this job saves."""
        if not isinstance(running, dict):
            return "not an object"
        key_file = running.get("key_file")
        directory = os.path.dirname(os.path.abspath(path))
        if not (
            isinstance(key_file, str)
            and os.path.dirname(key_file) == directory
            and _KEY_NAME.fullmatch(os.path.basename(key_file))
        ):
            return f"key file {key_file!r} is not one made beside it"
        meshes = running.get("meshes")
        if not isinstance(meshes, dict) or not all(
            isinstance(a, list) and all(isinstance(x, str) for x in a) for a in meshes.values()
        ):
            return "'meshes' is not a list of addresses per mesh"
        return ""

    def kill(self) -> None:
        """Stop the job's agents (and every process they run); forget the saved state."""
        if self._connected is not None:
            for hosts in self._connected._hosts.values():
                hosts.shutdown()
            self._connected = None
        if self._via is not None:
            self._via._kill()
            self._via = None
        elif self._running is not None:
            self._kill()
        self._running = None
        if self._path:
            _state_file.remove(self._path)

    # -- saved state ------------------------------------------------------------

    def dump(self, path: str) -> None:
        """Save spec and running state as JSON (no secrets: the keys stay in their file).

        Written 0600 as a new file that replaces the old one, in a directory of
        yours that nobody else may write (refused otherwise); links at or beside
        ``path`` redirect nothing. A job written to Monarch's contract is saved
        as Monarch saves it, a pickle (the same file checks; a directory others
        may write is accepted only when sticky, like ``/tmp``)."""
        if self._monarch_style():
            _state_file.write_bytes(path, self.dumps(), sticky_ok=True)
            return
        record = {"kind": self.kind, "spec": self.spec(), "running": self._running}
        _state_file.write(path, record)

    def dumps(self) -> bytes:
        """This job as a pickle, as Monarch's ``dumps`` (read back with ``job_loads``)."""
        return pickle.dumps(self)

    # -- per launcher -----------------------------------------------------------

    def _create(self, key_file: str) -> Any:
        """Ours: start the agents, return where they listen. Monarch's:
        ``_create(client_script)`` makes the job; what it returns is ignored."""
        raise NotImplementedError

    def _state(self) -> JobState:
        """Monarch's contract: the job's host meshes, once ``_create`` made it."""
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


class ProcessJob(JobTrait):
    """Agents as local processes, one per host of each mesh, that survive the kernel.

    For trying a multi-host program on one machine, and for a kernel restart
    that re-attaches (``state()`` again in the new kernel).
    """

    kind = "process"

    def __init__(
        self,
        meshes: Mapping[str, int] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        python: str | None = None,
    ):
        """``meshes``: hosts per mesh name; ``env``: variables the agents (and so
        the ranks) get on top of this process's environment, as Monarch's (saved
        with the spec: the state file is 0600)."""
        super().__init__()
        self.meshes = _meshes(meshes or {"hosts": 1}, "ProcessJob")
        self.env = _environment(env)
        self.python = python or sys.executable

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"meshes": self.meshes, "python": self.python}
        if self.env is not None:
            spec["env"] = self.env
        return spec

    def _argv(self, address: str, key_file: str, index: int) -> list[str]:
        return [
            self.python, *_AGENT, "--listen", address, "--key-file", key_file,
            "--host-index", str(index),
        ]  # fmt: skip

    def _create(self, key_file: str) -> dict[str, Any]:
        meshes: dict[str, list[str]] = {}
        agents: list[dict[str, Any]] = []
        for name, count in self.meshes.items():
            meshes[name] = []
            for index in range(count):
                address = f"tcp://127.0.0.1:{_free_port()}"
                argv = self._argv(address, key_file, index)
                proc = subprocess.Popen(
                    argv,
                    env=None if self.env is None else {**os.environ, **self.env},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # outlives the kernel; kill() ends it
                )
                meshes[name].append(address)
                # Its start time, read now, and argv prove later that a pid is still it.
                agents.append(_state_file.identity(proc.pid, argv))
                _CHILDREN[proc.pid] = proc
        return {"meshes": meshes, "agents": agents}

    def _running_problem(self, running: Any, path: str) -> str:
        problem = super()._running_problem(running, path)
        if problem:
            return problem
        meshes, agents = running["meshes"], running.get("agents")
        if {name: len(a) for name, a in meshes.items()} != self.meshes:
            return "its meshes are not the spec's"
        expected = [
            self._argv(address, running["key_file"], index)
            for addresses in meshes.values()
            for index, address in enumerate(addresses)
        ]
        if (
            not isinstance(agents, list)
            or [a.get("argv") if isinstance(a, dict) else None for a in agents] != expected
        ):
            return "its agents are not the ones this spec starts"
        if not all(_LOCAL_AGENT.fullmatch(a) for a in _flat(meshes)):
            return "an agent's address is not a loopback port"
        return ""

    def _alive(self) -> bool:
        agents = _saved_agents(self._running or {})
        return bool(agents) and all(_state_file.same_process(a) for a in agents)

    def _kill(self) -> None:
        for agent in _saved_agents(self._running or {}):
            _stop_agent(agent)


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
        free = "from monarch_nb._wire._network import free_port; print(free_port())"
        listen = f"tcp://{name}:$PORT"
        # env_setup first: if it fails, the key (on stdin) is never written there.
        return (
            host_prelude(self.python, self.env_setup)
            + f"umask 077; mkdir -p $(dirname {remote_key}); cat > {remote_key}; "
            + f'PORT=$("$p" -c {shlex.quote(free)}); '
            + _idle_timeout_export()
            + f'setsid nohup "$p" -m monarch_nb.agent --listen {listen} '
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

    def _running_problem(self, running: Any, path: str) -> str:
        problem = super()._running_problem(running, path)
        if problem:
            return problem
        pids = running.get("pids")
        if not isinstance(running.get("remote_key"), str) or not _REMOTE_KEY.fullmatch(
            running["remote_key"]
        ):
            return f"remote key {running.get('remote_key')!r} is not one this job writes"
        if not isinstance(pids, dict) or not all(
            host in self.hosts and type(pid) is int and pid > 1 for host, pid in pids.items()
        ):
            return "'pids' is not a pid per host of the spec"
        return ""

    def _kill(self) -> None:
        running = self._running or {}
        remote_key = running.get("remote_key", "")
        if not _REMOTE_KEY.fullmatch(remote_key):
            return  # nothing of ours to stop or remove
        for host, pid in running.get("pids", {}).items():
            # Signalled only while that pid still runs an agent with this job's
            # (random) key file: a pid reused since is left alone.
            pid = int(pid)
            key = shlex.quote(remote_key)
            stop = (
                f"if tr '\\0' '\\n' < /proc/{pid}/cmdline 2>/dev/null | grep -qxF -- {key}; "
                f"then kill {pid}; fi; rm -f {key}"
            )
            argv = [*self.ssh, *self.ssh_options, host, stop]
            subprocess.run(argv, capture_output=True, timeout=60, check=False)


def job_load(path: str = DEFAULT_JOB_PATH) -> JobTrait:
    """The job saved at ``path`` (by ``apply``/``state``), running state included.

    Unlike ``state()``, this takes the job's spec (its launcher commands) from
    the file: load only a file you wrote. One that is not yours, or that
    others may write, is refused (``PermissionError``).
    """
    data = _state_file.read_bytes(path, sticky_ok=True)
    if data is None:
        raise FileNotFoundError(f"no job state file at {path!r}")
    if data[:1] == b"\x80":  # a pickle: a job written to Monarch's contract
        return job_loads(data)
    record = _state_file.read(path)
    if record is None:
        raise FileNotFoundError(f"no job state file at {path!r}")
    cls = _KINDS.get(record.get("kind"))  # type: ignore[arg-type]
    if cls is None or not isinstance(record.get("spec"), dict):
        raise MeshUsageError(f"{path}: unknown job kind {record.get('kind')!r}")
    job = cls(**record["spec"])
    job._running = record.get("running")
    job._path = path
    return job


def job_loads(data: bytes) -> JobTrait:
    """A job from ``JobTrait.dumps()``, as Monarch's: a pickle, so only bytes you made."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise MeshUsageError(f"job_loads: the bytes hold a {type(job).__name__}, not a job")
    return job


# -- helpers ------------------------------------------------------------------------


def _load_pickled(path: str) -> JobTrait | None:
    """The Monarch-style job saved at ``path``; None when there is none, or when the
    file holds one of our JSON jobs (never unpickled, never acted on here)."""
    data = _state_file.read_bytes(path, sticky_ok=True)
    if data is None or data[:1] != b"\x80":
        return None
    return job_loads(data)


def _environment(env: Mapping[str, str] | None) -> dict[str, str] | None:
    if env is None:
        return None
    out = dict(env)
    bad = {k: v for k, v in out.items() if not (isinstance(k, str) and isinstance(v, str))}
    if bad:
        raise MeshUsageError(f"ProcessJob(env=...): names and values must be str, got {bad!r}")
    return out


def _key_file_for(cached_path: str | None) -> str:
    """A fresh 0600 key file beside the saved state (or in the run's private dir)."""
    if cached_path is None:
        from .._wire._rundir import run_dir

        base = run_dir()
    else:
        base = os.path.dirname(os.path.abspath(cached_path))
        _state_file.check_dir(base)  # ours, and nobody else may write in it
    path = os.path.join(base, f"job-{os.urandom(6).hex()}.key")
    _keys.write_key_file(path)
    return path


def _idle_timeout_export() -> str:
    """The shell line that gives a remote agent this process's ``agent_idle_timeout``
    (a local one inherits the variable): a job nobody re-attaches ends by itself."""
    setting = _config.SETTINGS["agent_idle_timeout"]
    return f"export {setting.env}={_config.get(setting.name)!r}; "


def _free_port() -> int:
    return free_port("127.0.0.1")


def _stop_agent(agent: dict[str, Any]) -> None:
    """Stop a saved local agent: through its Popen if this process started it (so it is
    reaped, not left a zombie that warns at exit), else by its saved identity."""
    pid = agent.get("pid")
    child = _CHILDREN.get(pid) if isinstance(pid, int) else None  # the file's: unchecked
    if child is not None and child.args == agent.get("argv"):
        del _CHILDREN[child.pid]
        _stop_child(child)
    else:
        _state_file.terminate(agent)


def _stop_child(child: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    child.terminate()
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _saved_agents(running: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent identities saved in ``running`` (see ``_state_file.identity``)."""
    agents = running.get("agents")
    return [a for a in agents if isinstance(a, dict)] if isinstance(agents, list) else []


def _flat(meshes: dict[str, list[str]]) -> list[str]:
    return [address for addresses in meshes.values() for address in addresses]


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
