"""``MeshAdminConfig`` and ``job.enable_admin()``, as Monarch's, accepted: monarch_nb
runs no mesh admin server.

Monarch's admin agent serves a job's topology over HTTP for its admin TUI.
Here the controller itself knows every mesh, and shows them where the user
already is: ``procs.status()``, ``%mesh status`` and the dashboard. A program
written for Monarch that configures the admin server runs unchanged; the
configuration is kept (``job.admin_config``), a warning says once that no
server starts, and ``JobState.admin_url`` stays None.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._unserved import note_unserved


@dataclass
class MeshAdminConfig:
    """Monarch's admin server settings (``admin_addr``): accepted, no server starts."""

    admin_addr: str | None = None


def note_admin_requested(config: MeshAdminConfig) -> None:
    """Say, once per process, that the admin server Monarch would start does not exist."""
    note_unserved(
        "enable_admin",
        config,
        MeshAdminConfig,
        "monarch_nb runs no mesh admin server (JobState.admin_url stays None); see the "
        "meshes with procs.status(), %mesh status or the dashboard",
    )
