"""Monarch's ``exec_command``: one command on every host of a host mesh (or on
one of them), its output streamed back or kept in files on each host, and the
worst exit status as the answer.

It runs in a process mesh of its own on the chosen hosts (as Monarch's runs in
a ``BashActor``): the command's output reaches the notebook through the
ranks' own streams, and nothing is left running once it returns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from .._model._errors import MeshUsageError
from .._model._future import Future, completed
from .._runtime._actors import Actor, endpoint


class CommandRunner(Actor):
    """Runs one command in this process's host, as the client asked."""

    @endpoint
    def run(
        self,
        cmd: list[str],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        output_dir: str | None,
    ) -> int:
        argv = list(cmd)
        if argv[0].endswith(".py") or argv[0] == "-m":
            argv.insert(0, sys.executable)  # a script or module: this host's interpreter
        # The client's directory where this host has it (a shared file system,
        # or the same machine), as Monarch's does; else the worker's own.
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)
        full_env = {**os.environ, **(env or {})}
        if output_dir is not None:
            os.makedirs(output_dir, exist_ok=True)
            with (
                open(os.path.join(output_dir, "stdout.txt"), "wb") as out,
                open(os.path.join(output_dir, "stderr.txt"), "wb") as err,
            ):
                child = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=out, stderr=err)
                return _wait(child)
        child = subprocess.Popen(
            argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        # Through this process's own streams, so the lines reach the client
        # labelled with the rank, as anything else a rank prints.
        assert child.stdout is not None
        assert child.stderr is not None
        errors = threading.Thread(target=_pump, args=(child.stderr, sys.stderr), daemon=True)
        errors.start()
        _pump(child.stdout, sys.stdout)
        status = _wait(child)
        errors.join()
        return status


def _pump(source: IO[bytes], sink: Any) -> None:
    for line in iter(source.readline, b""):
        sink.write(line.decode(errors="replace"))
        sink.flush()


def _wait(child: subprocess.Popen[bytes]) -> int:
    """The child's exit status as a shell reports it (128 + N when signal N
    ended it, so the worst of several is the largest); an interrupt of the
    rank ends the child too."""
    try:
        code = child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise
    return 128 - code if code < 0 else code


def exec_command(
    host_mesh: Any,
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    output_dir: str | None = None,
    rank: int | None = None,
    point: Mapping[str, int] | None = None,
    per_host: Mapping[str, int] | None = None,
) -> Future[int]:
    """Run ``cmd`` on every host of ``host_mesh`` (or the one at flat ``rank``,
    or the slice at ``point``), in ``per_host`` processes each (one by
    default), and return a future of the largest exit status (0: every one
    succeeded; 128 + N for a command ended by signal N).

    A ``cmd`` whose first word ends in ``.py``, or is ``-m``, runs with the
    host's Python. ``env`` adds to the environment, ``workdir`` is where it
    runs (else the client's directory where the host has it). With
    ``output_dir`` each host keeps the output in ``stdout.txt`` and
    ``stderr.txt`` there; without, it streams here, labelled by rank.

    As Monarch's; here it runs to the end before it returns (the future is
    done), as ``ProcMesh.stop()`` does.
    """
    if isinstance(cmd, str) or not cmd or not all(isinstance(w, str) for w in cmd):
        raise MeshUsageError(
            f"exec_command(cmd={cmd!r}): give the command as a non-empty list of "
            'strings, e.g. ["python", "train.py", "--lr", "0.1"]'
        )
    if rank is not None and point is not None:
        raise MeshUsageError(
            f"exec_command(rank={rank!r}, point={dict(point)!r}): give one of them, not both"
        )
    hosts = host_mesh
    if point is not None:
        hosts = hosts.slice(**point)
    elif rank is not None:
        hosts = hosts.flatten("rank").slice(rank=rank)
    procs = hosts.spawn_procs(per_host=dict(per_host) if per_host else None, name="exec_command")
    try:
        runners = procs.spawn("exec_command", CommandRunner)
        statuses = runners.run.call(
            list(cmd), dict(env) if env else None, workdir, os.getcwd(), output_dir
        ).get()
    finally:
        procs.stop()
    return completed(max(status for _, status in statuses.items()))
