"""Copying a workspace to the hosts of a host mesh: :meth:`HostMesh.sync_workspace`.

Two transports: rsync over the ssh that started the hosts (sends only what
changed), or one archive over the agents' link. ``"auto"`` tries rsync and
falls back to the agents where rsync fails.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._model import _checks
from .._model._errors import MeshUsageError
from .._services import _workspace
from . import _rsync

if TYPE_CHECKING:
    from ._hosts import HostAgents

_log = logging.getLogger("monarch_nb")


@dataclass(frozen=True)
class WorkspaceCopy:
    """Where :meth:`HostMesh.sync_workspace` put the files on one host."""

    host: str
    path: str
    files: int  # sent this time (rsync sends only what changed)
    nbytes: int
    transport: str = "agent"  # "agent" (the archive over its link) or "rsync"


def sync_workspace(
    agents: HostAgents | None,
    paths: str | Sequence[str] | None,
    *,
    dest: str | None,
    on_path: bool,
    compress: bool,
    transport: str,
    timeout: float,
) -> list[WorkspaceCopy]:
    """Copy ``paths`` to every host of ``agents`` (None: this host, nothing to copy);
    the arguments are :meth:`HostMesh.sync_workspace`'s."""
    timeout = _checks.bounded_timeout(timeout, "sync_workspace")
    if transport not in ("auto", "rsync", "agent"):
        raise MeshUsageError(
            f"sync_workspace(transport={transport!r}): use 'auto', 'rsync' or 'agent'"
        )
    if agents is None:
        return []
    if isinstance(paths, str):
        paths = [paths]
    paths = list(paths) if paths is not None else [os.getcwd()]
    if not paths:
        raise MeshUsageError("sync_workspace(paths=[]): name at least one file or directory")
    target = dest or _workspace.default_dest(paths)
    ssh = agents.ssh_command
    if transport == "rsync" and (ssh is None or shutil.which("rsync") is None):
        raise MeshUsageError(
            "sync_workspace(transport='rsync') needs hosts started by ssh_hosts() and "
            "rsync installed here; transport='agent' needs neither"
        )
    if transport != "agent" and ssh is not None and shutil.which("rsync") is not None:
        copies = _copy_by_rsync(agents, ssh, paths, target, on_path, transport, timeout)
        if copies is not None:
            return copies
    packed = _workspace.pack(paths, compress=compress)
    answers = agents.sync_workspace(packed.archive, target, on_path, timeout)
    return [
        WorkspaceCopy(host, answer.path, answer.files, answer.nbytes) for host, answer in answers
    ]


def _copy_by_rsync(
    agents: HostAgents,
    ssh: list[str],
    paths: list[str],
    target: str,
    on_path: bool,
    transport: str,
    timeout: float,
) -> list[WorkspaceCopy] | None:
    """rsync to every host, then tell each agent where the files are (an empty
    archive); None where "auto" should fall back to the agent."""
    hosts = [agent.label for agent in agents.agents]
    copied = _rsync.copy_to_hosts(ssh, hosts, paths, target, timeout)
    failed = [c for c in copied if c.returncode]
    if failed and transport == "auto":
        # No rsync on a host, an ssh that cannot carry it: the agents' link
        # always can (and says what is wrong if the copy itself cannot be made).
        _log.info(
            "sync_workspace: rsync failed (%s); sending the archive through the agents",
            "; ".join(f"{c.host}: {c.error}" for c in failed),
        )
        return None
    if failed:
        raise OSError(
            "sync_workspace failed on "
            + "; ".join(f"{c.host}: rsync exited {c.returncode}: {c.error}" for c in failed)
        )
    empty = _workspace.pack([]).archive
    answers = agents.sync_workspace(empty, target, on_path, timeout)
    return [
        WorkspaceCopy(host, answer.path, c.files, c.nbytes, "rsync")
        for (host, answer), c in zip(answers, copied, strict=True)
    ]
