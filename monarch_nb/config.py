"""Configuration as in Monarch's ``monarch.config``.

``configure``, ``configured``, ``get_global_config``, ``get_runtime_config``,
``clear_runtime_config``, and the pytest helpers ``parametrize_config`` and
``parametrize_config_pointwise``. Our settings (``SETTINGS``; ``table()``
prints them) are ``MONARCH_NB_*`` environment variables underneath, so a value
set here reaches every process started afterwards. Monarch's setting names
are accepted too (``MONARCH_SETTINGS``; ``monarch_table()``): some are aliases
of ours, the rest are kept and reported with no effect here.
"""

from __future__ import annotations

from ._services._config import (
    SETTINGS,
    Setting,
    SettingTypeError,
    clear_runtime_config,
    configure,
    configured,
    get,
    get_global_config,
    get_runtime_config,
    monarch_table,
    table,
)
from ._services._config_pytest import parametrize_config, parametrize_config_pointwise
from ._services._monarch_config import MONARCH_SETTINGS, Encoding, MonarchSetting

__all__ = [
    "MONARCH_SETTINGS",
    "SETTINGS",
    "Encoding",
    "MonarchSetting",
    "Setting",
    "SettingTypeError",
    "clear_runtime_config",
    "configure",
    "configured",
    "get",
    "get_global_config",
    "get_runtime_config",
    "monarch_table",
    "parametrize_config",
    "parametrize_config_pointwise",
    "table",
]
