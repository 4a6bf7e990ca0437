"""The kernel side of the JupyterLab "Mesh" panel (``labextension/``): a comm.

The panel opens a comm to target ``monarch_nb.panel`` when it meets a kernel,
and again after that kernel runs a cell naming monarch_nb (``%load_ext
monarch_nb``). The kernel never opens one: a front end without the panel
(nbconvert, nbval, a console) has no handler for it and would warn.
Over it the kernel sends JSON snapshots, built only from
``NotebookMesh.status()`` (what ``%mesh status`` and the dashboard show)::

    {"type": "snapshot", "meshes": [...], "failures": [...], "taken_at": ...}

when the panel connects, when a mesh's events say something changed (at most
``MAX_RATE_HZ`` times a second) and every ``REFRESH_S`` seconds for the
heartbeats. The panel sends ``{"action": "stop" | "restart" | "interrupt" |
"refresh", "mesh": NAME}`` and gets ``{"type": "result", "ok": ..., "message":
...}`` back, then a fresh snapshot. With a ``"rank": R`` the action is one
rank's (restart, logs, debug, why: :mod:`..widgets._rank_actions`), and the
result also carries ``"rank"``, ``"detail"`` (a log, a stack) and
``"command"`` (a cell for what a button cannot do).

A mesh's failure is in its own entry (``meshes[i].failure``), not again in
``failures``, which lists the ranks' failures; a dead rank has no CPU or
memory (the last sample of a dead process is not its state).

Snapshots are sent from a small daemon thread (the I/O thread only sets a
flag), so the panel stays live while a cell runs. Actions arrive on the
kernel's shell channel, so they run between cells: the panel interrupts a
busy kernel through the kernel's own interrupt, which reaches every busy rank.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .._controller._events import (
    CallFinished,
    CallStarted,
    MeshFailed,
    RankFailed,
    RankStateChanged,
)
from .._model._errors import MonarchNbError
from ..widgets._rank_actions import rank_action
from ..widgets._render import NotebookMeshStatus, work_text
from ._registry import REGISTRY, MeshRegistry
from ._stop import stop_in_flight

COMM_TARGET = "monarch_nb.panel"
REFRESH_S = 2.0
MAX_RATE_HZ = 2.0
ACTIONS = ("stop", "restart", "interrupt", "refresh")
_log = logging.getLogger(__name__)
_WATCHED = (RankStateChanged, RankFailed, MeshFailed, CallStarted, CallFinished)


def _main_shell(data: Any, default: str | None) -> None:
    """A comm's messages go to the kernel's main shell (subshell id None)."""
    return None


def panel_snapshot(registry: MeshRegistry = REGISTRY) -> dict[str, Any]:
    """Every notebook mesh, its ranks and its failures, as JSON-ready data.

    ``{"type": "snapshot", "taken_at": float, "meshes": [{"name", "state",
    "failure", "dist", "default", "shape": {dim: size}, "ranks": [{"rank",
    "point", "host", "pid", "state", "work", "work_text", "work_seconds",
    "cpu_percent", "rss_bytes", "gpu_memory_allocated", "heartbeat_age",
    "returncode", "failure"}]}], "failures": [{"mesh", "rank", "failure",
    "returncode"}]}``; the mesh's own failure is its ``failure``, not in ``failures``.
    """
    meshes = []
    failures: list[dict[str, Any]] = []
    for mesh in registry.all():
        try:
            status = mesh.status()
        except MonarchNbError:  # stopped between all() and status()
            continue
        meshes.append(_mesh_json(status))
        failures.extend(
            {"mesh": status.name, "rank": r.rank, "failure": r.failure,
             "returncode": r.returncode}
            for r in status.ranks
            if r.failure
        )  # fmt: skip
    return {"type": "snapshot", "taken_at": time.time(), "meshes": meshes, "failures": failures}


def _mesh_json(status: NotebookMeshStatus) -> dict[str, Any]:
    s = status.status
    gone = ("dead", "stopped")  # a sample of a process that is no more says nothing
    return {
        "name": s.name,
        "state": str(s.state),
        "failure": s.failure,
        "dist": status.dist,
        "default": status.default,
        "shape": dict(zip(s.shape.labels, s.shape.sizes, strict=True)),
        "ranks": [
            {
                "rank": r.rank,
                "point": dict(r.point),
                "host": r.host,
                "pid": r.pid,
                "state": str(r.state),
                "work": r.work,
                "work_text": work_text(r),
                "work_seconds": r.work_seconds,
                "cpu_percent": None if str(r.state) in gone else r.cpu_percent,
                "rss_bytes": None if str(r.state) in gone else r.rss_bytes,
                "gpu_memory_allocated": None if str(r.state) in gone else r.gpu_memory_allocated,
                "gpu_utilization": None if str(r.state) in gone else r.gpu_utilization,
                "heartbeat_age": r.heartbeat_age,
                "returncode": r.returncode,
                "failure": r.failure,
            }
            for r in s.ranks
        ],
    }


def run_action(action: str, mesh_name: str, registry: MeshRegistry = REGISTRY) -> dict[str, Any]:
    """Do what a panel button asks; the result message the panel shows."""
    if action not in ACTIONS:
        return _result(action, mesh_name, False, f"unknown action {action!r}; use one of {ACTIONS}")
    if action == "refresh":
        return _result(action, mesh_name, True, "")
    try:
        mesh = registry.get(mesh_name)
        if action == "stop":
            mesh.stop()
            message = f"mesh {mesh_name!r} stopped"
        elif action == "restart":
            mesh.restart()
            message = f"mesh {mesh_name!r} restarted"
        else:
            # --no-block cells' ranks that do not stop are killed and replaced.
            message = stop_in_flight(mesh)
    except MonarchNbError as exc:
        return _result(action, mesh_name, False, str(exc))
    return _result(action, mesh_name, True, message)


def run_rank_action(
    action: str, mesh_name: str, rank: Any, registry: MeshRegistry = REGISTRY
) -> dict[str, Any]:
    """Do what a rank's button in the panel asks (restart, logs, debug, why)."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        return _result(action, mesh_name, False, f"rank {rank!r} is not a rank number")
    try:
        mesh = registry.get(mesh_name)
    except MonarchNbError as exc:
        return {**_result(action, mesh_name, False, str(exc)), "rank": rank}
    done = rank_action(mesh, action, rank)
    return {
        **_result(action, mesh_name, done.ok, done.message),
        "rank": rank,
        "detail": done.detail,
        "command": done.command,
    }


def _result(action: str, mesh: str, ok: bool, message: str) -> dict[str, Any]:
    return {"type": "result", "action": action, "mesh": mesh, "ok": ok, "message": message}


class PanelServer:
    """Open panel comms, and the thread that keeps them fed with snapshots."""

    def __init__(self, registry: MeshRegistry = REGISTRY) -> None:
        self.registry = registry
        self._comms: dict[str, Any] = {}  # comm_id -> comm
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscriptions: dict[int, Any] = {}  # id(NotebookMesh) -> Subscription

    # -- comms ------------------------------------------------------------------------

    def on_comm_open(self, comm: Any, open_msg: Any = None) -> None:
        """The comm target's callback: a panel opened a comm to this kernel."""
        # ipykernel >= 7.4 routes a comm's incoming messages to the subshell that
        # last sent on it; JupyterLab >= 4.4 opens a subshell per comm target and
        # may delete it while a reopened comm still names it (the kernel closes the
        # panel's first comm when monarch_nb is not yet loaded). A message routed
        # there is dropped ("Unknown subshell_id") and a button does nothing. The
        # main shell always exists, and there actions run between cells, as the
        # panel says they do.
        comm._reply_subshell_for = _main_shell
        comm.on_msg(lambda msg: self._on_msg(comm, msg))
        comm.on_close(lambda msg: self._drop(comm))
        self._go_live(comm)

    def _go_live(self, comm: Any) -> None:
        with self._lock:
            known = comm.comm_id in self._comms
            self._comms[comm.comm_id] = comm
        if not known:
            self._send(comm, panel_snapshot(self.registry))
        self._ensure_thread()

    def _on_msg(self, comm: Any, msg: Any) -> None:
        self._go_live(comm)
        data = msg.get("content", {}).get("data", {}) or {}
        action, mesh = str(data.get("action")), str(data.get("mesh"))
        try:
            if data.get("rank") is not None:
                result = run_rank_action(action, mesh, data["rank"], self.registry)
            else:
                result = run_action(action, mesh, self.registry)
        except Exception as exc:  # a button must never fail in silence: say what broke
            _log.exception("monarch_nb panel: %s of mesh %r failed", action, mesh)
            result = _result(action, mesh, False, f"{action} failed: {type(exc).__name__}: {exc}")
        self._send(comm, result)
        self.changed()

    def _drop(self, comm: Any) -> None:
        with self._lock:
            self._comms.pop(comm.comm_id, None)

    def _send(self, comm: Any, data: dict[str, Any]) -> None:
        try:
            comm.send(data)
        except Exception:  # a comm whose kernel is going away: forget it
            self._drop(comm)

    def reveal(self, mesh: str) -> int:
        """Ask every connected panel to come into view at ``mesh``
        (``%mesh dashboard --side``); how many panels were asked."""
        with self._lock:
            comms = list(self._comms.values())
        for comm in comms:
            self._send(comm, panel_snapshot(self.registry))  # the mesh is in it
            self._send(comm, {"type": "reveal", "mesh": mesh})
        return len(comms)

    # -- updates -----------------------------------------------------------------------

    def changed(self, event: Any = None) -> None:
        """Something happened: send a snapshot soon (an event observer: only sets a flag)."""
        self._changed.set()

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._closing.clear()
            self._thread = threading.Thread(target=self._run, name="monarch_nb panel", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closing.is_set():
            self._changed.wait(REFRESH_S)
            if self._closing.is_set():
                break
            self._changed.clear()
            self._follow_meshes()
            with self._lock:
                comms = list(self._comms.values())
            if comms:
                snapshot = panel_snapshot(self.registry)
                for comm in comms:
                    self._send(comm, snapshot)
            time.sleep(1.0 / MAX_RATE_HZ)  # throttle: events in a burst make one snapshot

    def _follow_meshes(self) -> None:
        """Subscribe to the events of meshes started since the last look."""
        meshes = {id(mesh): mesh for mesh in self.registry.all()}
        for key in set(self._subscriptions) - set(meshes):
            self._subscriptions.pop(key).close()
        for key, mesh in meshes.items():
            if key not in self._subscriptions:
                self._subscriptions[key] = mesh.procs.events.subscribe(self.changed, kinds=_WATCHED)

    def close(self) -> None:
        """Close every comm and stop the thread (``%unload_ext``)."""
        self._closing.set()
        self._changed.set()
        with self._lock:
            comms, self._comms = list(self._comms.values()), {}
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(REFRESH_S + 1)
        for subscription in self._subscriptions.values():
            subscription.close()
        self._subscriptions.clear()
        for comm in comms:
            try:
                comm.close()
            except Exception:
                pass


def _comm_manager(shell: Any) -> Any:
    kernel = getattr(shell, "kernel", None)
    manager = getattr(kernel, "comm_manager", None)
    if manager is None and kernel is not None:
        try:
            import comm

            manager = comm.get_comm_manager()
        except ImportError:
            return None
    return manager


_servers: dict[int, PanelServer] = {}


def register_panel(shell: Any) -> None:
    """Serve the Mesh panel from this kernel (``%load_ext monarch_nb`` calls this).

    Outside a Jupyter kernel (plain ``ipython``) there is no panel: does nothing.
    """
    manager = _comm_manager(shell)
    if manager is None or id(shell) in _servers:
        return
    server = _servers[id(shell)] = PanelServer()
    manager.register_target(COMM_TARGET, server.on_comm_open)
    shell.events.register("post_run_cell", server.changed)  # %mesh start / stop


def reveal_panel(shell: Any, mesh: str) -> int:
    """Show the Mesh panel of the front ends connected to this kernel, at ``mesh``;
    0 when none is (Notebook 7, VS Code, nbconvert, a JupyterLab without it)."""
    server = _servers.get(id(shell))
    return server.reveal(mesh) if server is not None else 0


def unregister_panel(shell: Any) -> None:
    server = _servers.pop(id(shell), None)
    if server is None:
        return
    manager = _comm_manager(shell)
    if manager is not None:
        manager.unregister_target(COMM_TARGET, server.on_comm_open)
    try:
        shell.events.unregister("post_run_cell", server.changed)
    except ValueError:
        pass
    server.close()
