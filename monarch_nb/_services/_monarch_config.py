"""Monarch's setting names: their kinds, Monarch's defaults, and what each means here.

A Monarch name is one of two things:

- an **alias** of one of our settings (``alias``): reading it reads ours,
  converted to Monarch's form (seconds become ``"1m 30s"``), and setting it
  sets ours, so it changes what ours changes;
- **accepted without effect here**: the value is checked as Monarch checks
  it, kept in a ``MONARCH_NB_*`` variable (so processes started afterwards
  read the same value back) and reported, but nothing reads it. ``note``
  says why (a transport, a Rust runtime knob, ibverbs...).

This module only describes the names; ``_config`` checks, stores and reads
them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal[
    "duration",  # str in humantime notation, reported in canonical form
    "optional_duration",  # the same, or None (off)
    "int",  # int >= 0
    "positive_int",  # int >= 1
    "optional_positive_int",  # int >= 1, or None
    "float",
    "bool",
    "str",
    "encoding",  # an Encoding member
    "port_range",  # slice(start, stop), 0 <= start <= stop <= 65535
]


class Encoding(enum.Enum):
    """Monarch's message encodings (``configure(default_encoding=...)``); we
    have one wire format, so the choice is recorded and has no effect."""

    Bincode = "Bincode"
    Json = "Json"
    Multipart = "Multipart"


@dataclass(frozen=True)
class MonarchSetting:
    """One of Monarch's setting names, its kind, Monarch's default, and its meaning here."""

    name: str
    kind: Kind
    default: Any
    alias: str | None = None
    note: str = ""

    @property
    def env(self) -> str:
        return "MONARCH_NB_" + self.name.upper()


def _alias(name: str, kind: Kind, ours: str, note: str) -> MonarchSetting:
    return MonarchSetting(name, kind, None, alias=ours, note=note)


_TRANSPORT = "we pick the transport: Unix sockets on a host, TCP (CURVE) between hosts"
_RUST = "a knob of Monarch's Rust message layer, which we do not have"
_ADMIN = "Monarch's mesh-admin HTTP server, which we do not have"
_RDMA = "ibverbs tuning; our RDMA is CUDA IPC or TCP (see the rdma_* settings)"
_TELEMETRY = "Monarch's telemetry collector; ours is procs.telemetry()"

MONARCH_SETTINGS: dict[str, MonarchSetting] = {
    s.name: s
    for s in (
        # -- names that change what one of our settings changes ----------------------
        _alias(
            "host_spawn_ready_timeout",
            "duration",
            "start_timeout",
            "how long hosts and their workers have to start",
        ),
        _alias(
            "message_delivery_timeout",
            "duration",
            "host_timeout",
            "how long a host may be unreachable before what was sent to it fails "
            "(a local rank's death is seen at once)",
        ),
        _alias(
            "process_exit_timeout",
            "duration",
            "stop_grace",
            "how long a stopped process has to exit before it is killed",
        ),
        _alias(
            "mesh_terminate_timeout",
            "duration",
            "stop_grace",
            "how long a stopped process has to exit before it is killed",
        ),
        _alias(
            "codec_max_frame_length",
            "int",
            "max_frame_bytes",
            "largest frame accepted on a TCP socket between hosts",
        ),
        _alias(
            "enable_file_capture",
            "bool",
            "log_files",
            "every rank writes its output to a file (procs.logs())",
        ),
        # -- accepted, kept and reported; nothing here reads them -----------------------
        MonarchSetting("default_transport", "str", "unix", note=_TRANSPORT),
        MonarchSetting(
            "enable_log_forwarding",
            "bool",
            False,
            note="ranks' output always reaches the controller; "
            "procs.logging_option(stream_to_client=False) silences it",
        ),
        MonarchSetting(
            "tail_log_lines",
            "int",
            0,
            note="a crashed rank's error always carries its last 20 stderr lines",
        ),
        MonarchSetting(
            "read_log_buffer",
            "int",
            100,
            note="each output line is forwarded as it comes (Monarch reads it nowhere either)",
        ),
        MonarchSetting(
            "stop_actor_timeout",
            "duration",
            "10s",
            note="ActorMesh.stop() waits for __cleanup__ (Monarch reads it nowhere either)",
        ),
        MonarchSetting(
            "cleanup_timeout",
            "duration",
            "3s",
            note="__cleanup__ runs to its end; a process stop is bounded by stop_grace",
        ),
        MonarchSetting("mesh_proc_spawn_max_idle", "duration", "30s", note="see start_timeout"),
        MonarchSetting("actor_spawn_max_idle", "duration", "30s", note=_RUST),
        MonarchSetting("get_actor_state_max_idle", "duration", "30s", note=_RUST),
        MonarchSetting("supervision_watchdog_timeout", "duration", "2m", note=_RUST),
        MonarchSetting("proc_stop_max_idle", "duration", "30s", note="see stop_grace"),
        MonarchSetting("get_proc_state_max_idle", "duration", "1m", note=_RUST),
        MonarchSetting("mesh_attach_config_timeout", "duration", "1m", note=_RUST),
        MonarchSetting("mesh_orphan_timeout", "optional_duration", "1m", note=_RUST),
        MonarchSetting("message_ack_time_interval", "duration", "500ms", note=_RUST),
        MonarchSetting("message_ack_every_n_messages", "int", 1000, note=_RUST),
        MonarchSetting("message_ttl_default", "int", 64, note=_RUST),
        MonarchSetting("split_max_buffer_size", "int", 5, note=_RUST),
        MonarchSetting("split_max_buffer_age", "duration", "50ms", note=_RUST),
        MonarchSetting("default_encoding", "encoding", Encoding.Multipart, note=_RUST),
        MonarchSetting(
            "channel_net_rx_buffer_full_check_interval", "duration", "5s", note=_TRANSPORT
        ),
        MonarchSetting("channel_reconnect_timeout", "duration", "1m", note=_TRANSPORT),
        MonarchSetting("channel_tcp_keepalive_idle", "duration", "1m", note=_TRANSPORT),
        MonarchSetting("channel_tcp_congestion", "str", "", note=_TRANSPORT),
        MonarchSetting("server_heartbeat_interval", "duration", "1s", note="see heartbeat"),
        MonarchSetting("forwarder_flush_timeout", "duration", "5s", note=_RUST),
        MonarchSetting("message_latency_sampling_rate", "float", 0.01, note=_TELEMETRY),
        MonarchSetting("enable_dest_actor_reordering_buffer", "bool", True, note=_RUST),
        MonarchSetting("sequencer_max_locked_keys", "positive_int", 128, note=_RUST),
        MonarchSetting("terminated_snapshot_retention", "int", 100, note=_RUST),
        MonarchSetting(
            "mesh_bootstrap_enable_pdeathsig",
            "bool",
            True,
            note="a worker always exits when its controller does",
        ),
        MonarchSetting("mesh_terminate_concurrency", "int", 16, note="all ranks stop at once"),
        MonarchSetting("small_write_threshold", "int", 256, note=_RUST),
        MonarchSetting("max_cast_dimension_size", "int", 16, note=_RUST),
        MonarchSetting("max_cast_fanout", "positive_int", 16, note=_RUST),
        MonarchSetting("proc_launcher_kind", "str", "", note="see monarch_nb.job"),
        MonarchSetting("remote_alloc_bind_to_inaddr_any", "bool", False, note="see bind"),
        MonarchSetting("remote_alloc_bootstrap_addr", "str", "", note="see bind"),
        MonarchSetting("remote_alloc_allowed_port_range", "port_range", None, note="see bind"),
        MonarchSetting("stop_grace_period", "duration", "10s", note="see stop_grace"),
        MonarchSetting("tokio_worker_threads", "optional_positive_int", None, note=_RUST),
        MonarchSetting("enable_unawaited_python_task_traceback", "bool", False, note=_RUST),
        MonarchSetting("mesh_admin_addr", "str", "[::]:1729", note=_ADMIN),
        MonarchSetting("mesh_admin_config_dump_bridge_timeout", "duration", "5s", note=_ADMIN),
        MonarchSetting("mesh_admin_max_concurrent_resolves", "int", 2, note=_ADMIN),
        MonarchSetting("mesh_admin_pyspy_bridge_timeout", "duration", "13s", note=_ADMIN),
        MonarchSetting("mesh_admin_pyspy_client_timeout", "duration", "20s", note=_ADMIN),
        MonarchSetting("mesh_admin_pyspy_max_profile_duration", "duration", "5m", note=_ADMIN),
        MonarchSetting("mesh_admin_pyspy_timeout", "duration", "10s", note=_ADMIN),
        MonarchSetting("mesh_admin_query_child_timeout", "duration", "100ms", note=_ADMIN),
        MonarchSetting("mesh_admin_resolve_actor_timeout", "duration", "200ms", note=_ADMIN),
        MonarchSetting("mesh_admin_single_host_timeout", "duration", "3s", note=_ADMIN),
        MonarchSetting("mesh_admin_tree_timeout", "duration", "10s", note=_ADMIN),
        MonarchSetting("pyspy_bin", "str", "", note="we find py-spy on PATH"),
        MonarchSetting(
            "process_memory_metric_interval", "duration", "5m", note="see telemetry_minutes"
        ),
        MonarchSetting("enable_otel_metrics", "bool", True, note=_TELEMETRY),
        MonarchSetting("enable_otel_tracing", "bool", True, note=_TELEMETRY),
        MonarchSetting("enable_recorder_tracing", "bool", True, note=_TELEMETRY),
        MonarchSetting("enable_sqlite_tracing", "bool", False, note=_TELEMETRY),
        MonarchSetting("otel_metric_export_interval", "duration", "1s", note=_TELEMETRY),
        MonarchSetting("scuba_log_enter_exit", "bool", False, note=_TELEMETRY),
        MonarchSetting("monarch_log_suffix", "str", "", note="see log_dir"),
        MonarchSetting("file_log_level", "str", "", note="see procs.logs(level=)"),
        MonarchSetting("rdma_allow_tcp_fallback", "bool", True, note=_RDMA),
        MonarchSetting("rdma_disable_ibverbs", "bool", False, note=_RDMA),
        MonarchSetting("rdma_ibverbs_target", "str", "", note=_RDMA),
        MonarchSetting("rdma_peer_device_affinity", "str", "", note=_RDMA),
        MonarchSetting("rdma_max_chunk_size_mb", "int", 64, note=_RDMA),
        MonarchSetting("rdma_runtime_worker_threads", "int", 16, note=_RDMA),
        MonarchSetting("rdma_tcp_fallback_parallelism", "int", 1, note="see rdma_tcp_streams"),
        MonarchSetting("rdma_qp_init_timeout", "duration", "30s", note=_RDMA),
        MonarchSetting("rdma_qps_per_cq", "positive_int", 1, note=_RDMA),
        MonarchSetting("rdma_cq_busy_poll_window", "optional_duration", None, note=_RDMA),
    )
}
