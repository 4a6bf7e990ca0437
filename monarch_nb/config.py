"""Configuration as in Monarch's ``monarch.config``: configure, configured, get_global_config.

Every setting, its variable, type and default: ``SETTINGS`` (``table()``
prints it). Settings are ``MONARCH_NB_*`` environment variables underneath, so
a value set here reaches every process started afterwards.
"""

from __future__ import annotations

from ._common._config import (
    SETTINGS,
    Setting,
    configure,
    configured,
    get,
    get_global_config,
    table,
)

__all__ = ["SETTINGS", "Setting", "configure", "configured", "get", "get_global_config", "table"]
