"""``sync_workspace`` by rsync over the ssh that started the hosts' agents.

rsync sends only what changed since the last sync (a re-sync after editing
one file sends that file), where the agent path sends the whole archive every
time. It is used for hosts started by :func:`~monarch_nb.ssh_hosts` when
rsync is installed here; where it fails (no rsync on a host, an ssh that
cannot carry it), the archive goes through the agents instead
(``transport="auto"``). The same files are left out either way.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from .._services._workspace import SKIPPED_NAMES, SKIPPED_SUFFIXES, local_path


@dataclass(frozen=True)
class Copied:
    """What rsync did on one host: the files it sent (changed ones only) and
    their bytes, or ``error`` with its returncode."""

    host: str
    files: int
    nbytes: int
    returncode: int
    error: str


def remote_path(dest: str) -> str:
    """``dest`` as rsync names it on the host: ``~/x`` is ``x`` (relative paths
    start in the home directory), so no shell on the far side expands anything."""
    if dest == "~":
        return "."
    if dest.startswith("~/"):
        return dest[2:]
    return dest


def command(ssh: Sequence[str], host: str, paths: Sequence[str], dest: str) -> list[str]:
    """The rsync of ``paths`` (a directory's contents, a file by its name) into
    ``dest`` on ``host``, made if missing, over ``ssh``."""
    sources = []
    for given in paths:
        path, is_dir = local_path(given)
        sources.append(path.rstrip("/") + "/" if is_dir else path)
    excludes = [f"--exclude={name}" for name in sorted(SKIPPED_NAMES)]
    excludes += [f"--exclude=*{suffix}" for suffix in SKIPPED_SUFFIXES]
    return [
        "rsync",
        "--archive",
        "--no-links",  # as the agent path: regular files and directories only
        # Nothing group- or other-writable: the copy goes on every rank's PYTHONPATH,
        # and the agent refuses a destination others could write (umask 002 sources).
        "--chmod=go-w",
        "--mkpath",
        "--stats",
        *excludes,
        "-e",
        shlex.join(ssh),
        *sources,
        f"{host}:{remote_path(dest).rstrip('/')}/",
    ]


def _stat(text: str, label: str) -> int:
    found = re.search(rf"^{re.escape(label)}: ([\d,]+)", text, re.MULTILINE)
    return int(found.group(1).replace(",", "")) if found else 0


def copy_to_hosts(
    ssh: Sequence[str], hosts: Sequence[str], paths: Sequence[str], dest: str, timeout: float
) -> list[Copied]:
    """rsync to every host at once; what each did (errors are reported, not raised)."""
    running = [
        (
            host,
            subprocess.Popen(
                command(ssh, host, paths, dest),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for host in hosts
    ]
    copied = []
    for host, process in running:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            err = f"rsync took more than {timeout} s"
        returncode = process.returncode
        copied.append(
            Copied(
                host,
                _stat(out, "Number of regular files transferred"),
                _stat(out, "Total transferred file size"),
                returncode,
                err.strip() if returncode else "",
            )
        )
    return copied
