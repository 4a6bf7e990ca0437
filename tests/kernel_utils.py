"""A real IPython kernel for tests: start it, run cells, collect what a notebook would see.

Used by the magics tests and the notebook benchmark. Every wait has a
deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import os
import queue
import re
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_client.manager import KernelManager

WORKER_MODULE = "monarch_nb.worker"
ZYGOTE_NAME = "monarch_nb-zyg"  # a zygote's process name (monarch_nb/_worker/_zygote.py)
_OUTPUT_KINDS = (
    "stream",
    "display_data",
    "execute_result",
    "error",
    "update_display_data",
    "clear_output",
)


@dataclass
class Reply:
    """What one execute_request produced."""

    status: str
    content: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)  # iopub messages, in order

    def stream(self, name: str | None = None) -> str:
        """What the streams showed, as text (rank prefixes' colours taken off)."""
        return plain(self.raw_stream(name))

    def raw_stream(self, name: str | None = None) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.outputs
            if m["msg_type"] == "stream" and (name is None or m["content"]["name"] == name)
        )

    def displays(self) -> list[dict[str, Any]]:
        return [
            m["content"]
            for m in self.outputs
            if m["msg_type"] in ("display_data", "execute_result")
        ]

    def text(self) -> str:
        """Streams and plain-text displays, in order (what the notebook shows as text)."""
        parts = []
        for m in self.outputs:
            if m["msg_type"] == "stream":
                parts.append(m["content"]["text"])
            elif m["msg_type"] in ("display_data", "execute_result"):
                parts.append(m["content"]["data"].get("text/plain", "") + "\n")
            elif m["msg_type"] == "error":
                parts.append("\n".join(m["content"]["traceback"]) + "\n")
        return plain("".join(parts))

    @property
    def traceback(self) -> str:
        """The error's traceback as plain text ("" if the cell succeeded)."""
        return plain("\n".join(self.error["traceback"])) if self.error else ""

    @property
    def error(self) -> dict[str, Any] | None:
        errors = [m["content"] for m in self.outputs if m["msg_type"] == "error"]
        return errors[0] if errors else None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """``text`` without terminal colours (IPython colours tracebacks)."""
    return _ANSI.sub("", text)


class Kernel:
    """A running kernel with a blocking client; use as a context manager."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.manager = KernelManager(kernel_name="python3")
        kernel_env = dict(os.environ, **(env or {}))
        self.manager.start_kernel(
            env=kernel_env, extra_arguments=["--HistoryManager.enabled=False"]
        )
        self.client = self.manager.blocking_client()
        try:
            self.client.start_channels()
            self.client.wait_for_ready(timeout=60)
        except BaseException:
            # A kernel that never answered (one of its ports taken meanwhile, on a
            # busy host) still runs: end it, or it outlives the session, orphaned.
            self.client.stop_channels()
            self.manager.shutdown_kernel(now=True)
            raise
        self.pid = self.manager.provisioner.process.pid

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def execute(self, code: str, timeout: float = 60, *, wait: bool = True) -> Reply | str:
        """Run ``code``; the Reply once the kernel is idle again (or the msg id if not wait)."""
        msg_id = self.client.execute(code, store_history=False)
        if not wait:
            return msg_id
        return self.collect(msg_id, timeout)

    def collect(
        self, msg_id: str, timeout: float = 60, *, every: list[tuple[float, Any]] | None = None
    ) -> Reply:
        """The Reply to ``msg_id`` once the kernel is idle again; ``every`` also gets
        each iopub message seen meanwhile, whatever its parent (comm messages sent
        from other threads), with the seconds since this call."""
        start = time.monotonic()
        deadline = start + timeout
        outputs: list[dict[str, Any]] = []
        reply = None
        idle = False
        while not (idle and reply is not None):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to {msg_id} within {timeout} s; got {outputs!r}")
            if reply is None:
                try:
                    msg = self.client.get_shell_msg(timeout=0.01)
                    if msg["parent_header"].get("msg_id") == msg_id:
                        reply = msg
                except queue.Empty:
                    pass
            try:
                msg = self.client.get_iopub_msg(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            if every is not None:
                every.append((time.monotonic() - start, msg))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "status":
                idle = msg["content"]["execution_state"] == "idle"
            elif kind in _OUTPUT_KINDS:
                outputs.append(msg)
        return Reply(reply["content"]["status"], reply["content"], outputs)

    def iopub_for(self, msg_id: str, until: Any, timeout: float = 30) -> list[dict[str, Any]]:
        """iopub messages of ``msg_id`` until ``until(messages)`` is true (late output)."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        while not until(seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"condition not met within {timeout} s; got {seen!r}")
            try:
                msg = self.client.get_iopub_msg(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                seen.append(msg)
        return seen

    def ok(self, code: str, timeout: float = 60) -> Reply:
        """Run ``code`` and fail (with its output) unless it succeeded."""
        reply = self.execute(code, timeout)
        assert isinstance(reply, Reply)
        if reply.status != "ok":
            raise AssertionError(f"cell failed:\n{code}\n---\n{reply.text()}")
        return reply

    def worker_pids(self) -> list[int]:
        return worker_pids(self.pid)

    def shutdown(self) -> None:
        """Shut the kernel down and wait until none of its workers is left."""
        pids = self.worker_pids() if self.manager.is_alive() else []
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)
        wait_gone(pids)


def worker_pids(parent_pid: int | None = None) -> list[int]:
    """Live monarch_nb ranks (those ``parent_pid`` started if given: its children,
    or the children of its zygote, which is not a rank and not listed)."""
    procs = [
        p.info
        for p in psutil.process_iter(["pid", "ppid", "cmdline", "name"])
        if WORKER_MODULE in (p.info["cmdline"] or [])
    ]
    zygotes = {p["pid"] for p in procs if p["name"] == ZYGOTE_NAME}
    ours = {p["pid"] for p in procs if p["pid"] in zygotes and p["ppid"] == parent_pid}
    started = {parent_pid} | ours
    return [
        p["pid"]
        for p in procs
        if p["pid"] not in zygotes and (parent_pid is None or p["ppid"] in started)
    ]


def wait_gone(pids: list[int], timeout: float = 15) -> None:
    """Wait until every pid has exited; raise naming those still alive."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and _not_zombie(p)]
        if alive:
            psutil.wait_procs(
                [psutil.Process(p) for p in alive if psutil.pid_exists(p)], timeout=0.1
            )
    if alive:
        raise AssertionError(f"worker processes {alive} outlived their kernel")


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
