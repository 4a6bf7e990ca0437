"""monarch_nb.job written to Monarch's contract: a user's JobTrait subclass
(``_create(client_script)``, ``_state()``, ``_kill()``, ``can_run``), pickled
saves, ``LocalJob(hosts=[...]).apply()``, ``ProcessJob(meshes, env)``."""

from __future__ import annotations

import os
import sys

import pytest
from process_checks import wait_for_exit

from monarch_nb import MeshUsageError
from monarch_nb.job import JobState, JobTrait, LocalJob, ProcessJob, job_load, job_loads

pytestmark = pytest.mark.timeout(180)


class RecordingJob(JobTrait):
    """A job as a Monarch user writes one: _create returns nothing."""

    def __init__(self, names=("default",), serves=True) -> None:
        super().__init__()
        self.names = list(names)
        self.serves = serves
        self.created: list[str | None] = []
        self.killed = 0

    def _create(self, client_script: str | None = None) -> None:
        self.created.append(client_script)

    def _state(self) -> JobState:
        return JobState({name: f"mesh:{name}" for name in self.names})  # type: ignore[misc]

    def can_run(self, spec: JobTrait) -> bool:
        return self.serves

    def _kill(self) -> None:
        self.killed += 1


def test_apply_creates_once_and_passes_the_client_script():
    job = RecordingJob()
    assert not job.active
    job.apply(client_script="train.py")
    job.apply()
    assert job.created == ["train.py"]
    assert job.active
    assert job.state(cached_path=None).default == "mesh:default"
    assert job.created == ["train.py"]  # state() of an applied job creates nothing
    job.kill()
    assert job.killed == 1
    assert not job.active


def test_state_applies_saves_and_a_new_job_reattaches_to_the_saved_one(tmp_path):
    path = str(tmp_path / "state" / "job.pkl")
    first = RecordingJob(names=["trainers", "evaluators"])
    state = first.state(cached_path=path)
    assert (state.trainers, first.created) == ("mesh:trainers", [None])
    assert os.stat(path).st_mode & 0o777 == 0o600

    second = RecordingJob(names=["other"])
    again = second.state(cached_path=path)
    assert again.evaluators == "mesh:evaluators"  # the saved job's meshes
    assert second.created == []
    with pytest.raises(AttributeError, match="no mesh 'other'"):
        again.other  # noqa: B018


def test_a_saved_job_that_cannot_run_the_spec_is_killed_and_replaced(tmp_path):
    path = str(tmp_path / "job.pkl")
    saved = RecordingJob(names=["old"], serves=False)
    saved.apply()
    saved.dump(path)

    fresh = RecordingJob(names=["workers"])
    state = fresh.state(cached_path=path)
    assert state.workers == "mesh:workers"
    assert fresh.created == [None]
    assert job_load(path).names == ["workers"]  # the file now holds the new job


def test_dump_load_and_dumps_loads_keep_the_running_job(tmp_path):
    job = RecordingJob(names=["gpu_nodes"])
    job.apply()
    path = str(tmp_path / "job.pkl")
    job.dump(path)
    for loaded in (job_load(path), job_loads(job.dumps())):
        assert isinstance(loaded, RecordingJob)
        assert loaded.active
        assert loaded.state(cached_path=None).gpu_nodes == "mesh:gpu_nodes"
        assert loaded.created == [None]


def test_a_pickled_job_is_saved_in_a_sticky_directory_but_not_in_one_others_may_write(tmp_path):
    sticky, open_dir = tmp_path / "sticky", tmp_path / "open"
    for directory, mode in ((sticky, 0o1777), (open_dir, 0o777)):
        directory.mkdir()
        directory.chmod(mode)
    job = RecordingJob()
    job.state(cached_path=str(sticky / "job.pkl"))
    assert job_load(str(sticky / "job.pkl")).active
    with pytest.raises(PermissionError, match="writable by group or others"):
        RecordingJob().state(cached_path=str(open_dir / "job.pkl"))


def test_a_pickle_others_may_write_is_never_loaded(tmp_path):
    path = tmp_path / "job.pkl"
    RecordingJob().dump(str(path))
    path.chmod(0o666)
    with pytest.raises(PermissionError):
        job_load(str(path))
    with pytest.raises(PermissionError):
        RecordingJob().state(cached_path=str(path))


def test_our_jobs_never_unpickle_a_state_file(tmp_path):
    path = str(tmp_path / "job.json")
    RecordingJob().dump(path)
    with pytest.raises(ValueError, match="not a monarch_nb job state file"):
        ProcessJob().state(cached_path=path)


def test_job_loads_refuses_what_is_not_a_job():
    import pickle

    with pytest.raises(MeshUsageError, match="the bytes hold a list, not a job"):
        job_loads(pickle.dumps([1]))


def test_our_jobs_refuse_a_client_script():
    with pytest.raises(MeshUsageError, match=r"client_script='train.py'.*LocalJob"):
        ProcessJob().apply(client_script="train.py", cached_path=None)


def test_local_job_applies_and_names_its_meshes():
    job = LocalJob(hosts=["trainers", "workers", "parameter_servers"])
    job.apply()
    state = job.state()
    for name in ("trainers", "workers", "parameter_servers"):
        assert getattr(state, name) is not None
    assert not job.can_run(LocalJob())
    assert LocalJob().state().hosts is not None


def test_local_job_runs_a_client_script_detached(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "client.py"
    script.write_text(
        "import sys\nprint('client ran', sys.argv[0])\nprint('oops', file=sys.stderr)\n"
    )
    job = LocalJob(("batch_hosts",))
    job.apply(client_script=str(script))
    assert job.process.wait(timeout=120) == 0
    assert job.log_dir is not None
    assert job.log_dir.startswith(str(tmp_path / ".monarch_nb" / "logs"))
    with open(os.path.join(job.log_dir, "stdout.log")) as f:
        assert f.read() == f"client ran {script}\n"
    with open(os.path.join(job.log_dir, "stderr.log")) as f:
        assert f.read() == "oops\n"
    with pytest.raises(MeshUsageError, match="runs no client"):
        LocalJob().process  # noqa: B018


def test_process_job_takes_env_second_and_its_ranks_see_it(tmp_path):
    path = str(tmp_path / "job.json")
    job = ProcessJob({"hosts": 1}, {"NB_JOB_ENV_TEST": "from-the-job"})
    pids: set[int] = set()
    try:
        state = job.state(cached_path=path)
        pids = {agent["pid"] for agent in job._running["agents"]}
        with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
            seen = procs.run("__import__('os').environ.get('NB_JOB_ENV_TEST')").values()
        assert seen == ["from-the-job"]
        assert job_load(path).env == {"NB_JOB_ENV_TEST": "from-the-job"}
        assert not job_load(path).can_run(ProcessJob({"hosts": 1}))
    finally:
        job.kill()
    assert not wait_for_exit(pids, 10)


def test_process_job_env_must_be_strings():
    with pytest.raises(MeshUsageError, match=r"must be str, got \{'N': 1\}"):
        ProcessJob({"hosts": 1}, {"N": 1})  # type: ignore[dict-item]


def test_a_subclass_without_kind_does_not_replace_a_registered_one():
    from monarch_nb._jobs._job import _KINDS

    assert "job" not in _KINDS
    assert _KINDS["process"] is ProcessJob
    assert sys.modules[LocalJob.__module__]


def test_each_apply_gets_an_id_that_a_saved_job_keeps(tmp_path):
    job = RecordingJob()
    assert job.apply_id is None
    job.apply()
    first = job.apply_id
    assert first is not None
    assert job_loads(job.dumps()).apply_id == first
    job.kill()
    job.apply()
    assert job.apply_id not in (None, first)
    state = job.state(cached_path=None)
    assert (state.query_engine, state.telemetry_url, state.admin_url) == (None, None, None)
