"""``TelemetryConfig`` and ``job.enable_telemetry()``, as Monarch's, accepted:
monarch_nb starts no telemetry service.

Monarch's starts a telemetry sidecar (a query engine over the job's messages
and traces, a mesh admin agent, optional snapshots and a dashboard) when
``state()`` is called. Here the controller already keeps what those serve and
shows it where the user is: ``procs.telemetry()`` and ``procs.timeline()``,
``procs.status()``, ``%mesh status`` and the dashboard. A program written for
Monarch that enables telemetry runs unchanged: the configuration is kept
(``job.telemetry_config``), a warning says once that no service starts, and
``JobState.telemetry_url``, ``dashboard_url``, ``query_engine`` and
``query_engine_client`` stay None.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._unserved import note_unserved


@dataclass
class TelemetryConfig:
    """Monarch's telemetry settings: accepted, no telemetry service starts."""

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0


def note_telemetry_requested(config: TelemetryConfig) -> None:
    """Say, once per process, that the telemetry service Monarch would start does not exist."""
    note_unserved(
        "enable_telemetry",
        config,
        TelemetryConfig,
        "monarch_nb starts no telemetry service (JobState.telemetry_url stays None); read "
        "the ranks' metrics and calls with procs.telemetry(), procs.timeline(), "
        "procs.status() or the dashboard",
    )
