"""A job's state file is data, never code: a file someone else wrote (or one that
came out of a repository) runs no command, signals no process that is not the
job's own agent, and a link at or beside it redirects no write.

Before, ``ProcessJob(...).state()`` built the saved job from the file's spec and
stopped it with the file's own ``ssh`` command, SIGTERMed every pid listed,
wrote through ``job_state.json.tmp`` and used a ``.monarch_nb`` of anyone's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from process_checks import wait_for_exit

from monarch_nb import MeshUsageError
from monarch_nb._jobs import _state_file
from monarch_nb.job import ProcessJob, job_load

pytestmark = pytest.mark.timeout(120)

OTHER_UID = 65534 if os.geteuid() != 65534 else 65533
KEY_NAME = "job-0123456789ab.key"


def _save(path, record: dict, mode: int = 0o600) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    path.chmod(mode)


def _running_with(state_dir, agents: list[dict], address: str = "tcp://127.0.0.1:9") -> dict:
    return {"key_file": str(state_dir / KEY_NAME), "meshes": {"hosts": [address]}, "agents": agents}


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen]:
    """An unrelated process of ours, as any pid a state file might list."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    alive = proc.poll() is None
    proc.kill()
    proc.wait()
    assert not wait_for_exit({proc.pid}, 5)
    assert alive, "the unrelated process was signalled"


# -- commands from the file ----------------------------------------------------------


@pytest.mark.parametrize("with_running", [True, False], ids=["running", "not-running"])
def test_a_saved_ssh_command_is_never_run(tmp_path, with_running) -> None:
    marker = tmp_path / "MARKER"
    path = tmp_path / ".monarch_nb" / "job_state.json"
    record = {
        "kind": "ssh",
        "spec": {"hosts": ["h"], "ssh": ["sh", "-c", f"touch {marker}"]},
        "running": {"pids": {"h": 4242}, "remote_key": ".monarch_nb/agent-x.key"},
    }
    if not with_running:
        record["running"] = None
    _save(path, record)
    job = ProcessJob(meshes={"hosts": 1})
    try:
        if with_running:
            with pytest.raises(MeshUsageError, match="commands saved in it are never run"):
                job.state(cached_path=str(path))
        else:  # nothing runs: the file is simply replaced by this job's
            state = job.state(cached_path=str(path))
            with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
                assert procs.run("rank").values() == [0]
            assert json.loads(path.read_text())["kind"] == "process"
    finally:
        job.kill()
    assert not marker.exists()


def test_a_file_with_the_callers_spec_is_run_with_the_callers_launcher_only(tmp_path) -> None:
    # The same spec, but the running state points at a key file elsewhere.
    path = tmp_path / "job_state.json"
    job = ProcessJob(meshes={"hosts": 1})
    running = _running_with(tmp_path, [])
    running["key_file"] = "/etc/monarch-nb/stolen.key"
    _save(path, {"kind": "process", "spec": job.spec(), "running": running})
    with pytest.raises(MeshUsageError, match=r"key file '/etc/monarch-nb/stolen.key' is not one"):
        job.state(cached_path=str(path))


# -- pids from the file --------------------------------------------------------------


def _agent_argv(python: str, address: str, key_file: str) -> list[str]:
    return [python, "-m", "monarch_nb.agent", "--listen", address, "--key-file", key_file,
            "--host-index", "0"]  # fmt: skip


@pytest.mark.parametrize("spec", ["same", "other", "old-format"])
def test_an_unrelated_pid_in_the_file_is_never_signalled(tmp_path, bystander, spec) -> None:
    path = tmp_path / "job_state.json"
    job = ProcessJob(meshes={"hosts": 1})
    address = "tcp://127.0.0.1:9"
    argv = _agent_argv(job.python, address, str(tmp_path / KEY_NAME))
    # Its true boot and start time: only the command line gives it away.
    lie = {**_state_file.identity(bystander.pid, argv)}
    running = _running_with(tmp_path, [lie], address)
    saved_spec = job.spec() if spec == "same" else {**job.spec(), "meshes": {"other": 1}}
    if spec == "old-format":
        running = {"key_file": running["key_file"], "meshes": {}, "pids": [bystander.pid]}
    _save(path, {"kind": "process", "spec": saved_spec, "running": running})
    try:
        state = job.state(cached_path=str(path))
        with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
            assert procs.run("rank").values() == [0]
        assert bystander.poll() is None
        assert job._running["agents"][0]["pid"] != bystander.pid
    finally:
        job.kill()
    assert bystander.poll() is None
    # job_load(...).kill() trusts the file's spec, but still signals only proven agents.
    _save(path, {"kind": "process", "spec": job.spec(), "running": running})
    job_load(str(path)).kill()
    assert bystander.poll() is None
    assert not path.exists()


def test_a_reused_pid_is_not_signalled_and_the_recorded_process_is(tmp_path) -> None:
    code = "import time; print('ready', flush=True); time.sleep(300)"
    argv = [sys.executable, "-c", code]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"  # its command line is in place
        saved = _state_file.identity(proc.pid, argv)
        # The same pid and command line, started at another time: another process.
        for other in ({"start_time": saved["start_time"] + 1}, {"boot_id": "another-boot"}):
            assert not _state_file.same_process({**saved, **other})
            assert not _state_file.terminate({**saved, **other}, grace=1)
            assert proc.poll() is None
        assert _state_file.same_process(saved)
        assert _state_file.terminate(saved, grace=5)
        assert proc.wait(5) == -15
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert not wait_for_exit({proc.pid}, 5)
    assert not _state_file.terminate(saved)  # gone: nothing to signal


# -- where the file is written -------------------------------------------------------


@pytest.mark.parametrize("planted", ["job_state.json.tmp", "job_state.json"])
def test_a_link_at_or_beside_the_file_does_not_redirect_the_write(tmp_path, planted) -> None:
    state_dir = tmp_path / ".monarch_nb"
    state_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("the user's own file\n")
    (state_dir / planted).symlink_to(victim)
    path = state_dir / "job_state.json"
    if planted == "job_state.json":  # reading through it is refused too
        with pytest.raises(PermissionError, match="cannot be opened safely"):
            ProcessJob().state(cached_path=str(path))
    ProcessJob().dump(str(path))
    assert victim.read_text() == "the user's own file\n"
    assert not path.is_symlink()
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["kind"] == "process"
    assert sorted(p.name for p in state_dir.iterdir()) == sorted({planted, "job_state.json"})


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_state_file_or_directory_others_can_write_is_refused(tmp_path, what) -> None:
    marker = tmp_path / "MARKER"
    state_dir = tmp_path / ".monarch_nb"
    path = state_dir / "job_state.json"
    spec = {"hosts": ["h"], "ssh": ["sh", "-c", f"touch {marker}"]}
    _save(path, {"kind": "ssh", "spec": spec, "running": {"pids": {}}})
    target = path if what == "file" else state_dir
    target.chmod(0o666 if what == "file" else 0o777)
    with pytest.raises(
        PermissionError,
        match=rf"{what} {re.escape(repr(str(target)))} is writable by group or others",
    ):
        ProcessJob().state(cached_path=str(path))
    with pytest.raises(PermissionError, match="writable by group or others"):
        job_load(str(path))
    if what == "directory":  # nothing is written in it either: no key file, no state
        with pytest.raises(PermissionError, match="writable by group or others"):
            ProcessJob().apply(cached_path=str(path))
        assert sorted(p.name for p in state_dir.iterdir()) == ["job_state.json"]
    assert not marker.exists()


def test_a_linked_state_directory_is_refused(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / ".monarch_nb").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a directory of yours"):
        ProcessJob().apply(cached_path=str(tmp_path / ".monarch_nb" / "job_state.json"))
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.parametrize("what", ["file", "directory"])
def test_another_users_state_file_or_directory_is_refused(tmp_path, what) -> None:
    marker = tmp_path / "MARKER"
    state_dir = tmp_path / ".monarch_nb"
    path = state_dir / "job_state.json"
    spec = {"hosts": ["h"], "ssh": ["sh", "-c", f"touch {marker}"]}
    _save(path, {"kind": "ssh", "spec": spec, "running": {"pids": {}}})
    os.chown(path if what == "file" else state_dir, OTHER_UID, -1)
    belongs = rf"{what} '.*' belongs to uid {OTHER_UID}, not to you"
    with pytest.raises(PermissionError, match=belongs):
        ProcessJob().state(cached_path=str(path))
    with pytest.raises(PermissionError, match=belongs):
        job_load(str(path))
    if what == "directory":  # a .monarch_nb another user made gets no key file of ours
        with pytest.raises(PermissionError, match=belongs):
            ProcessJob().apply(cached_path=str(path))
        assert sorted(p.name for p in state_dir.iterdir()) == ["job_state.json"]
    assert not marker.exists()
