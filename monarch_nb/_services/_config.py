"""Settings: one table over the ``MONARCH_NB_*`` environment variables.

The environment is the store. ``configure(name=value)`` checks the name and
the value's type, then writes the variable, so every process started after
the call (workers, host agents: ``MONARCH_NB_*`` is forwarded to hosts)
sees it. A few settings are also read once by the controller when its module
is imported; for those the table names the module attribute, and
``configure`` refreshes it when that module is already loaded, so a change
made in a notebook after ``import monarch_nb`` still takes effect.

Monarch's ``monarch.config`` has the same calls, and its setting names work
too (``_monarch_config``): some are aliases of ours, read and written in
Monarch's form (``"1m 30s"``), the rest are checked, kept and reported with no
effect here. As Monarch's, what ``configure`` set is a layer over the
environment the process started with: ``get_runtime_config()`` lists it and
``clear_runtime_config()`` removes it, putting each variable back.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._model import _durations
from .._model._errors import MeshUsageError
from ._monarch_config import MONARCH_SETTINGS, Encoding, MonarchSetting


class SettingTypeError(MeshUsageError, TypeError):
    """A setting given a value of the wrong type (or a duration that does not parse).

    A ``TypeError`` as Monarch's ``configure`` raises, and a ``MeshUsageError``
    as every misuse of ours."""


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
            "stop_grace",
            float,
            10.0,  # Monarch's process_exit_timeout and mesh_terminate_timeout
            "seconds a stopped process has to exit (atexit handlers, __del__) before it is killed",
            ((_PG, "STOP_GRACE_S"),),
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
            "host_tree_fanout",
            str,
            "32",
            "how many host agents each level of a multi-host cast tree sends to: '32', or "
            "one per level, '8,16' (the last repeats below); a host mesh of no more hosts "
            "than the first is flat; '0': never a tree; read when a host mesh starts",
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
            (("monarch_nb._wire._signed", "MAX_FRAME_BYTES"),),
        ),
        Setting(
            "max_message_frames",
            int,
            1 << 16,
            "frames in one message (one per tensor or array over 4 KiB): senders refuse "
            "more, receivers drop such a message unread",
            (("monarch_nb._wire._signed", "MAX_FRAMES_PER_MESSAGE"),),
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
            "force_file_log",
            bool,
            False,
            "rank log files are written even when log_files is off",
        ),
        Setting(
            "prefix_with_rank",
            bool,
            True,
            "a script's ranks' output lines start with [rank] (a notebook labels them itself)",
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

# What configure() set (the runtime layer, as in Monarch), by name, in Monarch's
# form, and each variable's value from before configure first wrote it.
_runtime: dict[str, Any] = {}
_environment: dict[str, str | None] = {}


def _unknown(name: str) -> MeshUsageError:
    names = [*SETTINGS, *MONARCH_SETTINGS]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return MeshUsageError(
        f"unknown setting {name!r}; {hint}the settings are monarch_nb.config.SETTINGS "
        f"({', '.join(sorted(SETTINGS))}) and Monarch's names in "
        "monarch_nb.config.MONARCH_SETTINGS"
    )


def _setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise _unknown(name) from None


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
        raise SettingTypeError(
            f"configure({setting.name}={value!r}): expected {expected.__name__}, "
            f"got {type(value).__name__}"
        )
    if expected in (int, float) and value < 0:
        raise MeshUsageError(f"configure({setting.name}={value!r}): must be >= 0")
    return value


# -- Monarch's names ------------------------------------------------------------------


def _wrong_type(m: MonarchSetting, value: Any, expected: str) -> SettingTypeError:
    return SettingTypeError(
        f"configure({m.name}={value!r}): expected {expected}, got {type(value).__name__}"
    )


def _check_monarch(m: MonarchSetting, value: Any) -> Any:
    """``value`` checked as Monarch checks ``m``'s kind, in the form it reads back."""
    kind = m.kind
    if value is None and kind.startswith("optional_"):
        return None
    if kind in ("duration", "optional_duration"):
        if not isinstance(value, str):
            raise _wrong_type(m, value, f"a duration string such as {_durations.EXAMPLES}")
        try:
            return _durations.format_ns(_durations.parse_ns(value))
        except _durations.DurationFormatError as exc:
            raise SettingTypeError(
                f"configure({m.name}={value!r}): Invalid duration format {value!r} ({exc}); "
                f"write numbers with units, such as {_durations.EXAMPLES}"
            ) from None
    if kind in ("int", "positive_int", "optional_positive_int"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise _wrong_type(m, value, "int")
        least = 0 if kind == "int" else 1
        if value < least:
            raise MeshUsageError(f"configure({m.name}={value!r}): must be >= {least}")
        return value
    if kind == "float":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _wrong_type(m, value, "float")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise _wrong_type(m, value, "bool (True or False)")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _wrong_type(m, value, "str")
        return value
    if kind == "encoding":
        if not isinstance(value, Encoding):
            raise _wrong_type(m, value, "an Encoding (monarch_nb.config.Encoding.Json...)")
        return value
    # port_range
    if not isinstance(value, slice):
        raise _wrong_type(m, value, "a port range, slice(start, stop)")
    start, stop = value.start, value.stop
    if not all(isinstance(p, int) and 0 <= p <= 65535 for p in (start, stop)):
        raise _wrong_type(m, value, "slice(start, stop) of ports in [0, 65535]")
    if value.step not in (None, 1) or start > stop:
        raise MeshUsageError(
            f"configure({m.name}={value!r}): give slice(start, stop), start <= stop"
        )
    return slice(start, stop)


def _encode(m: MonarchSetting, value: Any) -> str:
    if value is None:
        return "none"
    if m.kind == "bool":
        return "1" if value else "0"
    if m.kind == "encoding":
        return str(value.name)
    if m.kind == "port_range":
        return f"{value.start}:{value.stop}"
    return str(value)


def _decode(m: MonarchSetting, raw: str) -> Any:
    try:
        if raw == "none" and m.kind.startswith("optional_"):
            return None
        if m.kind == "bool":
            return raw.lower() in _TRUE
        if m.kind in ("int", "positive_int", "optional_positive_int"):
            return int(raw)
        if m.kind == "float":
            return float(raw)
        if m.kind == "encoding":
            return Encoding[raw]
        if m.kind == "port_range":
            start, stop = raw.split(":")
            return slice(int(start), int(stop))
        if m.kind in ("duration", "optional_duration"):
            return _durations.format_ns(_durations.parse_ns(raw))
    except (ValueError, KeyError, _durations.DurationFormatError):
        raise MeshUsageError(f"{m.env}={raw!r} is not a valid {m.kind} for {m.name}") from None
    return raw


def _to_monarch(m: MonarchSetting, ours: Any) -> Any:
    """An alias's value read from our setting, in Monarch's form."""
    if m.kind == "duration":
        return _durations.format_seconds(ours)
    return ours


def _get_monarch(m: MonarchSetting) -> Any:
    if m.alias is not None:
        return _to_monarch(m, get(m.alias))
    raw = os.environ.get(m.env)
    return m.default if raw is None else _decode(m, raw)


# -- the store --------------------------------------------------------------------------


def get(name: str) -> Any:
    """The current value of one setting (from its variable, else the default);
    a Monarch name's in Monarch's form (``"30s"``)."""
    if name in MONARCH_SETTINGS:
        return _get_monarch(MONARCH_SETTINGS[name])
    setting = _setting(name)
    raw = os.environ.get(setting.env)
    return setting.default if raw is None else _parse(setting, raw)


def get_global_config() -> dict[str, Any]:
    """Every setting's current value, by name: ours, then Monarch's names."""
    merged = {name: get(name) for name in SETTINGS}
    merged.update({name: _get_monarch(m) for name, m in MONARCH_SETTINGS.items()})
    return merged


def get_runtime_config() -> dict[str, Any]:
    """What ``configure`` set in this process (names and values as given, durations
    in canonical form); not what came from the environment or the defaults."""
    return dict(_runtime)


def _write(env: str, raw: str | None) -> None:
    _environment.setdefault(env, os.environ.get(env))
    if raw is None:
        os.environ.pop(env, None)
    else:
        os.environ[env] = raw


def _refresh(setting: Setting) -> None:
    """Copy the setting's current value into the modules that read it at import."""
    current = get(setting.name)
    for module_name, attribute in setting.live:
        module = sys.modules.get(module_name)
        if module is not None and current is not None:
            setattr(module, attribute, current)


def _apply(setting: Setting, value: Any) -> None:
    if value is None:
        _write(setting.env, None)
    elif setting.type is bool:
        _write(setting.env, "1" if value else "0")
    else:
        _write(setting.env, str(value))
    _refresh(setting)


def _checked(name: str, value: Any) -> tuple[Setting | MonarchSetting, Any]:
    """Where ``name``'s value goes and the value to store there."""
    if name in SETTINGS:
        return SETTINGS[name], _check(SETTINGS[name], value)
    m = MONARCH_SETTINGS.get(name)
    if m is None:
        raise _unknown(name)
    if m.alias is None:
        return m, _check_monarch(m, value)
    ours = SETTINGS[m.alias]
    if value is None:
        return ours, None
    checked = _check_monarch(m, value)
    if m.kind == "duration":
        return ours, _durations.parse_seconds(checked)
    return ours, _check(ours, checked)


def configure(**settings: Any) -> None:
    """Set settings by name, ours or Monarch's; ``None`` restores a setting's default.

    All names and values are checked before any is applied::

        monarch_nb.config.configure(start_timeout=120, heartbeat=0.5)
        monarch_nb.config.configure(host_spawn_ready_timeout="2m")   # Monarch's name

    Raises:
        SettingTypeError: a value of the wrong type, or a duration that does not
            parse (a ``TypeError``, as Monarch's).
        MeshUsageError: an unknown name (a ``ValueError``, as Monarch's), or a
            value out of range.
    """
    checked = [(name, *_checked(name, value)) for name, value in settings.items()]
    for name, target, value in checked:
        if isinstance(target, Setting):
            _apply(target, value)
        else:
            _write(target.env, _encode(target, value))
        _runtime.pop(name, None)
        if value is not None or isinstance(target, MonarchSetting):
            _runtime[name] = get(name)


def clear_runtime_config() -> None:
    """Undo every ``configure``: each variable it wrote gets back the value it had
    before (from the environment, or none: the default)."""
    restored = dict(_environment)
    _environment.clear()
    _runtime.clear()
    for env, raw in restored.items():
        if raw is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = raw
    for setting in SETTINGS.values():
        if setting.env in restored:
            _refresh(setting)


@contextlib.contextmanager
def configured(**settings: Any) -> Iterator[dict[str, Any]]:
    """Apply settings for the body of a ``with`` block, then restore them.

    Yields the whole configuration as it is inside the block. As Monarch's: on
    exit, what ``configure`` had set before the block is set again, and nothing
    else (a bad name or value restores it too).
    """
    before = get_runtime_config()
    try:
        configure(**settings)
        yield get_global_config()
    finally:
        clear_runtime_config()
        configure(**before)


def table() -> str:
    """The settings as a Markdown table (name, variable, type, default, meaning)."""
    rows = ["| setting | variable | type | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS.values():
        default = "—" if s.default is None else repr(s.default)
        rows.append(f"| `{s.name}` | `{s.env}` | {s.type.__name__} | {default} | {s.doc} |")
    return "\n".join(rows)


def monarch_table() -> str:
    """Monarch's names as a Markdown table: kind, Monarch's default, effect here."""
    rows = ["| Monarch name | kind | Monarch's default | here |", "|---|---|---|---|"]
    for m in MONARCH_SETTINGS.values():
        if m.alias is not None:
            rows.append(f"| `{m.name}` | {m.kind} | | `{m.alias}`: {m.note} |")
    for m in MONARCH_SETTINGS.values():
        if m.alias is None:
            default = m.default.name if isinstance(m.default, Encoding) else repr(m.default)
            rows.append(f"| `{m.name}` | {m.kind} | {default} | no effect: {m.note} |")
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
