"""monarch_nb.config: names and types checked, variables written, restored, seen by workers."""

from __future__ import annotations

import os

import pytest

from monarch_nb import Actor, MeshUsageError, config, endpoint, this_host
from monarch_nb._controller import _interrupt, _process_group


class EnvProbe(Actor):
    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def test_every_setting_is_in_the_table_with_its_variable():
    text = config.table()
    for setting in config.SETTINGS.values():
        assert f"`{setting.env}`" in text
    assert set(config.get_global_config()) == set(config.SETTINGS)


def test_configured_sets_and_restores_the_variable_and_the_live_copy():
    before = config.get_global_config()
    with config.configured(start_timeout=7, deterministic=True) as inside:
        assert inside["start_timeout"] == 7.0
        assert os.environ["MONARCH_NB_START_TIMEOUT"] == "7.0"
        assert os.environ["MONARCH_NB_DETERMINISTIC"] == "1"
        assert _process_group.START_TIMEOUT_S == 7.0
    assert config.get_global_config() == before
    assert before["start_timeout"] == _process_group.START_TIMEOUT_S


def test_configure_none_restores_the_default():
    with config.configured(interrupt_grace=1.5):
        assert _interrupt.GRACE_S == 1.5
        config.configure(interrupt_grace=None)
        assert "MONARCH_NB_INTERRUPT_GRACE" not in os.environ
        assert config.get("interrupt_grace") == 3.0


def test_a_slower_heartbeat_does_not_make_ranks_look_silent():
    # "Silent" (named when a call times out) is three missed beats of the beat the
    # ranks were started with, also once the setting is back to its default: with
    # beats 5 s apart, a rank 3.5 s into its first interval is not silent.
    import time

    with config.configured(heartbeat=5):
        procs = this_host().spawn_procs(per_host={"procs": 1})
    with procs:
        group = procs._group
        started = group.workers[0].started
        while time.monotonic() - started < 3.5:
            time.sleep(0.1)  # a time that must pass, not an event to wait for
        assert group.silent_ranks([0]) == {}


def test_unknown_names_and_wrong_types_are_named():
    with pytest.raises(MeshUsageError, match=r"unknown setting 'start_timout'.*start_timeout"):
        config.configure(start_timout=1)
    with pytest.raises(MeshUsageError, match=r"heartbeat='fast'\): expected float, got str"):
        config.configure(heartbeat="fast")
    with pytest.raises(MeshUsageError, match=r"rdma_port=True\): expected int, got bool"):
        config.configure(rdma_port=True)
    with pytest.raises(MeshUsageError, match="must be >= 0"):
        config.configure(heartbeat=-1.0)
    # Nothing applied when any one is wrong.
    with pytest.raises(MeshUsageError):
        config.configure(start_timeout=9, nope=1)
    assert "MONARCH_NB_START_TIMEOUT" not in os.environ or config.get("start_timeout") != 9


def test_a_bad_variable_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv("MONARCH_NB_DETERMINISTIC", "maybe")
    with pytest.raises(MeshUsageError, match="MONARCH_NB_DETERMINISTIC='maybe' is not a boolean"):
        config.get_global_config()


def test_workers_started_inside_configured_see_the_setting():
    with (
        config.configured(rdma_timeout=33.0),
        this_host().spawn_procs(per_host={"procs": 1}) as procs,
    ):
        probe = procs.spawn("probe", EnvProbe)
        assert probe.env.call_one("MONARCH_NB_RDMA_TIMEOUT").get(timeout=30) == "33.0"
