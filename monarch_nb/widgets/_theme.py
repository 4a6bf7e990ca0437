"""The dashboard's colours in a light and a dark theme, as CSS custom properties.

Tiles are HTML strings whose inline style names a property with its light
colour as the fallback (``background:var(--mnb-idle-bg,#c8e6c9)``); a dark
front end (JupyterLab's dark theme, VS Code's) gets the dark values from the
style sheet the dashboard displays once. Every pair keeps its text at 4.5:1
or more against its background (WCAG AA), in either theme
(``tests/test_theme_contrast.py`` measures it in a browser).
"""

from __future__ import annotations

from typing import NamedTuple

from .._controller._events import RankState


class Colours(NamedTuple):
    """A state's tile colours: background and text, in a light and a dark theme."""

    light_bg: str
    light_fg: str
    dark_bg: str
    dark_fg: str


# One row a state, so that no state has one theme's colours and not the other's.
COLOURS: dict[RankState, Colours] = {
    RankState.STARTING: Colours("#cfd8dc", "#263238", "#263238", "#cfd8dc"),
    RankState.IDLE: Colours("#c8e6c9", "#1b5e20", "#1b3320", "#a5d6a7"),
    RankState.BUSY: Colours("#bbdefb", "#0d47a1", "#102a43", "#90caf9"),
    RankState.PAUSED: Colours("#ffe082", "#5d4037", "#3e3000", "#ffe082"),
    RankState.FAILED: Colours("#ef9a9a", "#7f0000", "#4a1414", "#ef9a9a"),
    RankState.DEAD: Colours("#c62828", "#ffffff", "#b71c1c", "#ffffff"),
    RankState.STOPPED: Colours("#e0e0e0", "#616161", "#2b2b2b", "#bdbdbd"),
}
# White on this orange is 5.6:1 (the earlier #e65100 was 3.8:1).
STRAGGLER_BG = "#bf360c"

_DARK_BODIES = (
    'body[data-jp-theme-light="false"]',  # JupyterLab, Notebook 7
    "body.vscode-dark",
    "body.vscode-high-contrast:not(.vscode-high-contrast-light)",
)


def background(state: RankState) -> str:
    """The tile's background for ``state``: the dark theme's where one is shown."""
    return f"var(--mnb-{state.value}-bg,{COLOURS[state].light_bg})"


def foreground(state: RankState) -> str:
    return f"var(--mnb-{state.value}-fg,{COLOURS[state].light_fg})"


def style_sheet() -> str:
    """The dashboard's ``<style>``: the dark theme's tile colours, and text of the
    chart and the header that follows the theme."""
    variables = ";".join(
        f"--mnb-{state.value}-bg:{c.dark_bg};--mnb-{state.value}-fg:{c.dark_fg}"
        for state, c in COLOURS.items()
    )
    dark = ",".join(f"{body} .mnb-dashboard" for body in _DARK_BODIES)
    return (
        "<style>"
        f"{dark}{{{variables}}}"
        # bqplot colours a legend's text like its line: a blue line's label on a
        # dark page is 3.8:1. The swatch keeps the colour; the text is the page's.
        ".mnb-dashboard .mnb-chart .legendtext,.monarch-nb-timeline .legendtext"
        "{fill:var(--jp-content-font-color1,currentColor)!important}"
        "</style>"
    )
