"""The matplotlib backend of ranks (``module://monarch_nb._worker._mpl_backend``).

Agg draws; ``plt.show()`` sends every open figure to the notebook cell that
runs the code, then closes it (see :mod:`._rich`).
"""

from __future__ import annotations

from typing import Any

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

from . import _rich

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args: Any, **kwargs: Any) -> None:
    _rich.show_figures()
