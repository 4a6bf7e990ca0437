"""``LocalJob``, as Monarch's: this host under each mesh name, and a client
script run detached. Written to Monarch's job contract (``_create``,
``_state``, ``_kill``), so saved as a pickle."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from .._controller._proc_mesh import this_host
from .._model._errors import MeshUsageError
from ._job import BATCH_JOB_ENV, JobState, JobTrait


class LocalJob(JobTrait):
    """This host under each name: ``state().hosts`` is ``this_host()``, as Monarch's.

    A stand-in for a remote job: switch a program between local and remote
    by changing only the job. ``apply()`` starts nothing (the local host always
    exists); ``apply(client_script="train.py")`` runs the script as a detached
    client, its output in ``job.log_dir`` (``stdout.log``, ``stderr.log``),
    its process ``job.process``; in it, any job's ``state()`` is this job's
    (batch mode, as Monarch's). Written to Monarch's job contract.
    """

    kind = "local"

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self.hosts = [hosts] if isinstance(hosts, str) else list(hosts)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_dir: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_proc": None}

    def spec(self) -> dict[str, Any]:
        return {"hosts": self.hosts}

    def can_run(self, other: JobTrait) -> bool:
        return False  # nothing to re-attach to: each state() is this host again

    def state(self, cached_path: str | None = None, timeout: float | None = 60.0) -> JobState:
        """One ``this_host()`` per name (nothing is saved unless ``cached_path`` is given)."""
        return super().state(cached_path, timeout)

    def _state(self) -> JobState:
        return JobState({name: this_host() for name in self.hosts})

    def _create(self, client_script: str | None) -> None:
        if client_script is None:
            return
        base = os.path.abspath(".monarch_nb/logs")
        os.makedirs(base, mode=0o700, exist_ok=True)
        self._log_dir = tempfile.mkdtemp(prefix="job_", dir=base)
        # Batch mode, as Monarch's: the script's own job.state() finds this job (its
        # meshes), whatever job the script describes; saved in the private log dir.
        saved = os.path.join(self._log_dir, "job_state.pkl")
        self.dump(saved)
        env = {**os.environ, BATCH_JOB_ENV: saved, "MONARCH_BATCH_JOB": "1"}
        with (
            open(os.path.join(self._log_dir, "stdout.log"), "wb") as out,
            open(os.path.join(self._log_dir, "stderr.log"), "wb") as err,
        ):
            self._proc = subprocess.Popen(
                [sys.executable, client_script],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # a client of its own: it outlives this one
            )

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The client started by ``apply(client_script=...)``."""
        if self._proc is None:
            raise MeshUsageError("this LocalJob runs no client: apply(client_script=...) first")
        return self._proc

    @property
    def log_dir(self) -> str | None:
        """Where the client's ``stdout.log`` and ``stderr.log`` are (None without one)."""
        return self._log_dir

    def _kill(self) -> None:
        pass  # the local host is not stopped; a client script runs to its end
