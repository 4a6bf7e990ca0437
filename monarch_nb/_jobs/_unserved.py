"""A service of Monarch's that a job accepts here but does not run (its mesh
admin server, :mod:`._admin`; its telemetry sidecar, :mod:`._telemetry`).

A program written for Monarch that configures one runs unchanged: the
configuration's type is checked, the job keeps it, and a warning says once per
process that no service starts and where to see instead what it would serve.
"""

from __future__ import annotations

import warnings

_said: set[str] = set()  # the methods whose warning this process has given


def note_unserved(method: str, config: object, config_type: type, instead: str) -> None:
    """``method(config)`` was asked for: check ``config``, then warn (once per
    process and method) that the service does not exist, saying ``instead``."""
    if not isinstance(config, config_type):
        raise TypeError(f"{method} takes a {config_type.__name__}, got {config!r}")
    if method in _said:
        return
    _said.add(method)
    # 1 this function, 2 note_*_requested, 3 the job's method, 4 its caller
    warnings.warn(f"{method}(): {instead}", stacklevel=4)
