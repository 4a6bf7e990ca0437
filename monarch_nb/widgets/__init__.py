"""The live dashboard of a mesh: ipywidgets tiles fed by the mesh's event stream.

Notebook side only (the core never imports this package). ``%mesh start``
shows a :class:`Dashboard`; ``%mesh dashboard`` or ``mesh.dashboard()`` shows
another. Without a widget front end the same object displays as text
(:func:`render_text`), so plain IPython and nbval see a summary, not an error.

Modules: ``_model`` (pure data: failures, progress, throttling), ``_text``
(the text and HTML summaries), ``_tiles`` (one tile per rank),
``_failures`` (the failure panel and a rank's last output), ``_dashboard``
(the widget, its observer and its update thread). Importing this package
imports nothing heavy; ipywidgets loads with the first dashboard.
"""

from __future__ import annotations

import importlib
from typing import Any

_DEFINED_IN = {
    "Dashboard": "_dashboard",
    "FailureLog": "_model",
    "FailureRecord": "_model",
    "Progress": "_model",
    "TextDashboard": "_dashboard",
    "render_text": "_text",
    "show_dashboard": "_dashboard",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch_nb.widgets' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = sorted(_DEFINED_IN)
