"""monarch_nb.config: names and types checked, variables written, restored, seen by workers;
Monarch's names: durations, the runtime layer, and what each alias changes."""

from __future__ import annotations

import atexit
import os
import time

import pytest

from monarch_nb import Actor, MeshFailure, MeshUsageError, config, endpoint, this_host
from monarch_nb._controller import _hosts, _interrupt, _process_group
from monarch_nb._model import _durations
from monarch_nb._wire import _signed
from monarch_nb.events import EventLog, Output


class EnvProbe(Actor):
    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def setting(self, name: str) -> object:
        return config.get_global_config()[name]


class Printer(Actor):
    @endpoint
    def say(self, text: str) -> None:
        print(text)


class SlowExit(Actor):
    @endpoint
    def hold_the_exit(self) -> int:
        atexit.register(time.sleep, 60)  # the process would take a minute to exit
        return os.getpid()


def test_every_setting_is_in_the_table_with_its_variable():
    text = config.table()
    for setting in config.SETTINGS.values():
        assert f"`{setting.env}`" in text
    assert set(config.get_global_config()) == set(config.SETTINGS) | set(config.MONARCH_SETTINGS)


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


# -- Monarch's names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("30s", "30s"),
        ("500ms", "500ms"),
        ("90s", "1m 30s"),
        ("1h30m", "1h 30m"),
        ("1h 30m", "1h 30m"),
        ("300s", "5m"),
        ("2 days", "2days"),
        ("1m 30s 250ms", "1m 30s 250ms"),
    ],
)
def test_durations_read_back_in_monarchs_canonical_form(text, canonical):
    assert _durations.format_ns(_durations.parse_ns(text)) == canonical
    with config.configured(mesh_proc_spawn_max_idle=text) as inside:
        assert inside["mesh_proc_spawn_max_idle"] == canonical
    assert config.get("mesh_proc_spawn_max_idle") == "30s"


def test_bad_durations_and_types_are_type_errors_naming_setting_and_value():
    for bad in ("30", "invalid", "abc123", "1.5s", ""):
        with pytest.raises(
            TypeError, match=rf"process_exit_timeout={bad!r}.*Invalid duration format"
        ):
            config.configure(process_exit_timeout=bad)
    cases = [
        ({"message_delivery_timeout": 30}, r"message_delivery_timeout=30\): expected a duration"),
        ({"message_ack_every_n_messages": "100"}, r"message_ack_every_n_messages='100'.*int"),
        ({"prefix_with_rank": "true"}, r"prefix_with_rank='true'\): expected bool"),
        ({"message_latency_sampling_rate": "0.5"}, r"sampling_rate='0.5'\): expected float"),
        ({"default_encoding": "bincode"}, r"default_encoding='bincode'.*Encoding"),
    ]
    for kwargs, match in cases:
        with pytest.raises(config.SettingTypeError, match=match):
            config.configure(**kwargs)
    assert config.get_runtime_config() == {}


def test_an_unknown_name_is_a_value_error_with_a_suggestion():
    with pytest.raises(
        ValueError,
        match=r"unknown setting 'message_delivery_timout'.*did you mean "
        r"'message_delivery_timeout'",
    ):
        config.configure(message_delivery_timout="1s")


def test_names_with_no_effect_here_round_trip_and_reach_workers():
    assert config.get("rdma_ibverbs_target") == ""
    with config.configured(
        rdma_ibverbs_target="nic:mlx5_0",
        default_encoding=config.Encoding.Json,
        remote_alloc_allowed_port_range=slice(8000, 9000),
        mesh_orphan_timeout=None,
        mesh_admin_addr="[::]:8080",
    ) as inside:
        assert inside["default_encoding"] is config.Encoding.Json
        assert inside["remote_alloc_allowed_port_range"] == slice(8000, 9000)
        assert inside["mesh_orphan_timeout"] is None
        with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            probe = procs.spawn("probe", EnvProbe)
            assert probe.setting.call_one("rdma_ibverbs_target").get(timeout=30) == "nic:mlx5_0"
    after = config.get_global_config()
    assert after["rdma_ibverbs_target"] == ""
    assert after["default_encoding"] is config.Encoding.Multipart
    assert after["mesh_orphan_timeout"] == "1m"
    for m in config.MONARCH_SETTINGS.values():
        assert m.alias is not None or m.note, m.name


def test_runtime_layer_is_what_configure_set_over_the_environment(monkeypatch):
    monkeypatch.setenv("MONARCH_NB_HEARTBEAT", "2.0")
    config.configure(heartbeat=0.5, stop_actor_timeout="1m 30s")
    try:
        assert config.get_runtime_config() == {"heartbeat": 0.5, "stop_actor_timeout": "1m 30s"}
        with config.configured(heartbeat=0.25) as inside:
            assert inside["heartbeat"] == 0.25
            assert config.get_runtime_config()["stop_actor_timeout"] == "1m 30s"
        assert config.get("heartbeat") == 0.5  # the outer configure comes back
    finally:
        config.clear_runtime_config()
    assert config.get_runtime_config() == {}
    assert config.get("heartbeat") == 2.0  # the environment's value, not the default
    assert _process_group.HEARTBEAT_S == 2.0
    assert config.get("stop_actor_timeout") == "10s"


def test_aliases_read_and_write_our_settings_and_their_live_copies():
    with config.configured(
        message_delivery_timeout="1m 30s",
        codec_max_frame_length=1 << 20,
        enable_file_capture=False,
    ) as inside:
        assert inside["host_timeout"] == 90.0
        assert _hosts.HOST_TIMEOUT_S == 90.0
        assert inside["max_frame_bytes"] == 1 << 20
        assert _signed.MAX_FRAME_BYTES == 1 << 20
        assert os.environ["MONARCH_NB_MAX_FRAME_BYTES"] == str(1 << 20)  # for hosts started now
        assert inside["log_files"] is False
    with config.configured(start_timeout=90):
        assert config.get("host_spawn_ready_timeout") == "1m 30s"
    assert config.get("codec_max_frame_length") == 1 << 30
    assert _signed.MAX_FRAME_BYTES == 1 << 30


def _never_ready() -> None:
    time.sleep(120)  # the start timeout fires long before; the spawn kills it


def test_host_spawn_ready_timeout_bounds_the_start_of_workers():
    # A start that cannot end in time: its bootstrap sleeps. (A 1 ms timeout on
    # a plain start raced: a rank forked from the zygote may say hello before
    # the caller begins to wait, as it did once in CI under load.)
    with (
        config.configured(host_spawn_ready_timeout="500ms"),
        pytest.raises(MeshFailure, match=r"did not start within 0\.5 s"),
    ):
        this_host().spawn_procs(per_host={"procs": 1}, bootstrap=_never_ready)


def test_mesh_terminate_timeout_is_how_long_a_stopping_process_may_take():
    # An atexit handler that sleeps a minute: the stop kills the process after
    # the grace instead of waiting (our default grace is 5 s).
    with config.configured(mesh_terminate_timeout="300ms"):
        assert config.get("process_exit_timeout") == "300ms"
        procs = this_host().spawn_procs(per_host={"procs": 1})
        procs.spawn("slow", SlowExit).hold_the_exit.call_one().get(timeout=30)
        worker = procs._group.workers[0]
        started = time.monotonic()
        procs.stop()
        assert time.monotonic() - started < 4.0
    # Killed, not exited. The stop reaped it (popen's code); the I/O thread's exit
    # handler, which copies that to worker.returncode, may not have run yet.
    assert worker.popen.returncode == -9


def test_prefix_with_rank_off_prints_lines_bare(capfd):
    for prefix, expected in ((False, "bare line\n"), (True, "[0] bare line\n")):
        log = EventLog()
        with (
            config.configured(prefix_with_rank=prefix),
            this_host().spawn_procs(per_host={"procs": 1}) as procs,
            procs.events.subscribe(log),
        ):
            capfd.readouterr()
            procs.spawn("printer", Printer).say.call_one("bare line").get(timeout=30)
            log.wait_for(Output, lambda e: e.line == "bare line", timeout=30)
            out = capfd.readouterr().out
        assert expected in out.splitlines(keepends=True), out


def test_force_file_log_writes_rank_files_with_log_files_off(tmp_path):
    for force in (False, True):
        with (
            config.configured(log_files=False, force_file_log=force, log_dir=str(tmp_path)),
            this_host().spawn_procs(per_host={"procs": 1}, name=f"forced{force}") as procs,
        ):
            procs.spawn("printer", Printer).say.call_one("to the file").get(timeout=30)
        written = [p.name for p in tmp_path.rglob("0.log")]
        assert bool(written) is force, written


@config.parametrize_config_pointwise(stop_grace=[1.0, 2.0], prefix_with_rank=[False, True])
def test_parametrize_config_pointwise_runs_each_position_configured():
    assert config.get("prefix_with_rank") is (config.get("stop_grace") == 2.0)
    assert config.get("stop_grace") == _process_group.STOP_GRACE_S
