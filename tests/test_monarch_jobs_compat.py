"""Monarch's job surface where its own tests met ours: ``enable_telemetry``
(accepted, no service starts) and a ``ProcessJob`` subclass written against
Monarch's internals (refused before it starts anything, saying what to write
instead)."""

import warnings

import pytest

from monarch_nb import MeshUsageError
from monarch_nb.actor import Actor, endpoint
from monarch_nb.job import JobState, JobTrait, ProcessJob, TelemetryConfig


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


class MonarchStyleJob(JobTrait):
    """A job written to Monarch's contract: its hosts are this host."""

    def _create(self, client_script: str | None) -> None:
        self.created = True

    def _state(self) -> JobState:
        from monarch_nb import this_host

        return JobState({"hosts": this_host()})

    def _kill(self) -> None:
        pass


def test_enable_telemetry_is_accepted_and_the_job_runs() -> None:
    job = MonarchStyleJob()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert job.enable_telemetry(TelemetryConfig(retention_secs=2)) is job
        job.enable_telemetry(include_dashboard=True)  # kwargs build the config, as Monarch's
    assert job.telemetry_config == TelemetryConfig(include_dashboard=True)
    assert len(caught) <= 1  # said once per process
    with pytest.raises(TypeError, match="unexpected keyword"):
        job.enable_telemetry(retention=5)
    state = job.state(cached_path=None)
    assert state.telemetry_url is None
    assert state.query_engine is None
    with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
        assert procs.spawn("echo", Echo).echo.call_one(7).get(timeout=60) == 7


class DuplexLikeJob(ProcessJob):
    """Monarch's test duplex job: overrides ProcessJob._create(client_script)."""

    def _create(self, client_script):  # type: ignore[override]
        raise AssertionError("must not be reached: apply() refuses the job first")


def test_a_process_job_subclass_written_for_monarch_is_refused_naming_the_fix() -> None:
    with pytest.raises(MeshUsageError) as info:
        DuplexLikeJob({"hosts": 1}).apply(cached_path=None)
    text = str(info.value)
    assert "DuplexLikeJob overrides ProcessJob._create(client_script)" in text
    assert "attach_to_workers" in text
    assert "JobTrait" in text
    # Nothing was started: the leak check (conftest) holds for this test too.
