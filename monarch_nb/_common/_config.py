"""Settings: one table over the ``MONARCH_NB_*`` environment variables.

The environment is the store. ``configure(name=value)`` checks the name and
the value's type, then writes the variable, so every process started after
the call (workers, host agents: ``MONARCH_NB_*`` is forwarded to hosts)
sees it. A few settings are also read once by the controller when its module
is imported; for those the table names the module attribute, and
``configure`` refreshes it when that module is already loaded, so a change
made in a notebook after ``import monarch_nb`` still takes effect.

Monarch's ``monarch.config`` has the same three calls (``configure``,
``configured``, ``get_global_config``); the setting names are ours.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ._errors import MeshUsageError


@dataclass(frozen=True)
class Setting:
    """One setting: its name, variable, type, default and meaning."""

    name: str
    type: type
    default: Any
    doc: str
    # (module, attribute) pairs that hold a copy read at import time.
    live: tuple[tuple[str, str], ...] = ()

    @property
    def env(self) -> str:
        return "MONARCH_NB_" + self.name.upper()


_PG = "monarch_nb._controller._process_group"
_HOSTS = "monarch_nb._controller._hosts"

SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "start_timeout",
            float,
            60.0,
            "seconds a mesh's workers have to start before the start fails",
            ((_PG, "START_TIMEOUT_S"), (_HOSTS, "START_TIMEOUT_S")),
        ),
        Setting(
            "heartbeat",
            float,
            1.0,
            "seconds between heartbeats from the controller to workers and agents",
            ((_PG, "HEARTBEAT_S"), (_HOSTS, "HEARTBEAT_S")),
        ),
        Setting(
            "host_timeout",
            float,
            5.0,
            "seconds without a host agent's heartbeat after which the host is lost",
            ((_HOSTS, "HOST_TIMEOUT_S"),),
        ),
        Setting(
            "interrupt_grace",
            float,
            3.0,
            "seconds an interrupted rank has to stop before it is killed",
            (
                ("monarch_nb._controller._interrupt", "GRACE_S"),
                ("monarch_nb._controller._calls", "GRACE_S"),
            ),
        ),
        Setting(
            "agent_idle_timeout",
            float,
            3600.0,
            "seconds a listening host agent (a job's, or monarch-nb agent --listen) waits with "
            "no controller attached before it exits, removing a key file its job made "
            "(0: never); read when the agent starts",
        ),
        Setting(
            "bind",
            str,
            "127.0.0.1",
            "address the controller listens on (an interface for other hosts)",
        ),
        Setting(
            "max_frame_bytes",
            int,
            1 << 30,
            "largest frame accepted on a TCP socket between hosts",
            (("monarch_nb._common._peer", "MAX_TCP_FRAME_BYTES"),),
        ),
        Setting(
            "max_message_frames",
            int,
            1 << 16,
            "frames in one message (one per tensor or array over 4 KiB): senders refuse "
            "more, receivers drop such a message unread",
            (("monarch_nb._common._wire", "MAX_FRAMES_PER_MESSAGE"),),
        ),
        Setting(
            "link",
            str,
            "unix",
            "the controller's link to its local workers: unix (a plain Unix stream socket) or "
            "zmq (libzmq's ipc:// socket); read when the controller starts",
        ),
        Setting(
            "deterministic",
            bool,
            False,
            "notebook output of every cell ordered by rank",
        ),
        Setting(
            "run_dir",
            str,
            None,
            "private directory for ipc sockets (default: a fresh one in /tmp, removed when its "
            "maker exits, or by the next mesh on the host if its maker was killed)",
        ),
        Setting(
            "log_files",
            bool,
            True,
            "every rank writes its output and logging records to a file (procs.logs())",
        ),
        Setting(
            "log_dir",
            str,
            None,
            "where rank log files go, one directory per mesh (default: ~/.monarch_nb/logs)",
        ),
        Setting(
            "log_max_bytes",
            int,
            10 << 20,
            "size at which a rank's log file rotates (0.log becomes 0.log.1)",
        ),
        Setting("log_backups", int, 3, "rotated log files kept per rank"),
        Setting(
            "telemetry_minutes",
            float,
            10.0,
            "minutes of each rank's heartbeat samples and log_metric points kept (telemetry())",
        ),
        Setting(
            "rdma_transport",
            str,
            "auto",
            "tensor data plane: auto, local (same host) or tcp",
        ),
        Setting(
            "rdma_host",
            str,
            "127.0.0.1",
            "address a buffer owner's data server listens on",
        ),
        Setting("rdma_port", int, 0, "port of the data server (0: any free port)"),
        Setting(
            "rdma_advertise",
            str,
            None,
            "address handles advertise for the data server (default: the bound one)",
        ),
        Setting(
            "rdma_tcp_streams",
            int,
            None,
            "parallel connections per large copy (default: by size, up to 4)",
        ),
        Setting(
            "rdma_timeout",
            float,
            120.0,
            "seconds without progress before a copy fails",
        ),
    )
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        known = ", ".join(sorted(SETTINGS))
        raise MeshUsageError(
            f"unknown setting {name!r}; the settings are: {known} (see monarch_nb.config.SETTINGS)"
        ) from None


def _parse(setting: Setting, raw: str) -> Any:
    if setting.type is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise MeshUsageError(f"{setting.env}={raw!r} is not a boolean (use 1 or 0)")
    try:
        return setting.type(raw)
    except ValueError:
        raise MeshUsageError(
            f"{setting.env}={raw!r} is not a valid {setting.type.__name__}"
        ) from None


def _check(setting: Setting, value: Any) -> Any:
    if value is None:
        return None
    expected = setting.type
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise MeshUsageError(
            f"configure({setting.name}={value!r}): expected {expected.__name__}, "
            f"got {type(value).__name__}"
        )
    if expected in (int, float) and value < 0:
        raise MeshUsageError(f"configure({setting.name}={value!r}): must be >= 0")
    return value


def get(name: str) -> Any:
    """The current value of one setting (from its variable, else the default)."""
    setting = _setting(name)
    raw = os.environ.get(setting.env)
    return setting.default if raw is None else _parse(setting, raw)


def get_global_config() -> dict[str, Any]:
    """Every setting's current value, by name."""
    return {name: get(name) for name in SETTINGS}


def _apply(setting: Setting, value: Any) -> None:
    if value is None:
        os.environ.pop(setting.env, None)
    elif setting.type is bool:
        os.environ[setting.env] = "1" if value else "0"
    else:
        os.environ[setting.env] = str(value)
    current = setting.default if value is None else value
    for module_name, attribute in setting.live:
        module = sys.modules.get(module_name)
        if module is not None and current is not None:
            setattr(module, attribute, current)


def configure(**settings: Any) -> None:
    """Set settings by name; ``None`` restores a setting's default.

    All names and values are checked before any is applied::

        monarch_nb.config.configure(start_timeout=120, heartbeat=0.5)

    Raises:
        MeshUsageError: an unknown name, or a value of the wrong type.
    """
    checked = [(s, _check(s, v)) for s, v in ((_setting(n), v) for n, v in settings.items())]
    for setting, value in checked:
        _apply(setting, value)


@contextlib.contextmanager
def configured(**settings: Any) -> Iterator[dict[str, Any]]:
    """Apply settings for the body of a ``with`` block, then restore them.

    Yields the whole configuration as it is inside the block.
    """
    saved = {name: os.environ.get(_setting(name).env) for name in settings}
    configure(**settings)
    try:
        yield get_global_config()
    finally:
        for name, raw in saved.items():
            setting = SETTINGS[name]
            _apply(setting, None if raw is None else _parse(setting, raw))


def table() -> str:
    """The settings as a Markdown table (name, variable, type, default, meaning)."""
    rows = ["| setting | variable | type | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS.values():
        default = "—" if s.default is None else repr(s.default)
        rows.append(f"| `{s.name}` | `{s.env}` | {s.type.__name__} | {default} | {s.doc} |")
    return "\n".join(rows)


# -- torch.distributed, as a mesh started with a backend sets it up -------------------

COLLECTIVE_TIMEOUT_S = 60.0


def collective_timeout() -> float:
    """How long a collective waits for a peer before it raises on the ranks that wait
    (torch.distributed's timeout, set for ``--dist``): a rank that died or hangs in
    a collective fails the others within this, not torch's default 30 minutes.
    ``MONARCH_NB_COLLECTIVE_TIMEOUT`` (seconds) when the mesh (re)starts, else 60."""
    value = os.environ.get("MONARCH_NB_COLLECTIVE_TIMEOUT", "")
    try:
        seconds = float(value) if value else COLLECTIVE_TIMEOUT_S
    except ValueError:
        raise MeshUsageError(
            f"MONARCH_NB_COLLECTIVE_TIMEOUT={value!r}: give seconds, e.g. 60"
        ) from None
    if seconds <= 0:
        raise MeshUsageError(f"MONARCH_NB_COLLECTIVE_TIMEOUT={value!r}: give seconds > 0")
    return seconds
