"""The live dashboard in a real browser: JupyterLab in headless Chromium.

A Jupyter server on loopback (with a token) serves a notebook that starts a
2-rank mesh, whose cell shows the dashboard, raises the same error on both
ranks, then kills rank 1 from a cell. The test waits for rank 1's tile to
turn dead and name its signal, reads the failure panel (identical failures
folded by rank set, newest first), saves a screenshot under tests/artifacts/
(gitignored), and clears the panel.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_harness import SKIP_WITHOUT_CHROMIUM, notebook_page, served_notebook

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), SKIP_WITHOUT_CHROMIUM]

ARTIFACTS = Path(__file__).parent / "artifacts"
CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2",
    "%%mesh\nraise ValueError('on every rank')",
    "%%mesh --ranks 1\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "%mesh stop",
]


@pytest.fixture
def notebook_url(tmp_path: Path) -> Iterator[str]:
    """URL of a notebook of CELLS in JupyterLab, served on loopback with a token."""
    with served_notebook(tmp_path, CELLS, name="dashboard.ipynb") as url:
        yield url


def test_dashboard_shows_a_killed_rank_dead_with_its_signal(
    notebook_url: str, tmp_path: Path
) -> None:
    wait = {"timeout": 90_000}
    with notebook_page(notebook_url) as page:
        page.keyboard.press("Shift+Enter")  # %mesh start: the dashboard
        page.wait_for_selector(".mnb-dashboard .mnb-tile.mnb-idle[data-rank='1']", **wait)
        assert page.locator(".mnb-dashboard .mnb-tile").count() == 2
        page.keyboard.press("Shift+Enter")  # the same error on both ranks: one entry
        page.wait_for_selector(".mnb-dashboard .mnb-failure[data-rank='0-1']", **wait)
        page.keyboard.press("Shift+Enter")  # kill rank 1
        dead_tile = ".mnb-dashboard .mnb-tile.mnb-dead[data-rank='1']"
        page.wait_for_selector(dead_tile, **wait)
        page.wait_for_selector(".mnb-dashboard .mnb-failure[data-rank='1']", **wait)
        # Looked up again, not through the element the wait returned: the
        # dashboard redraws its tiles as updates arrive, and a replaced element has
        # no computed style ('' came back once, under load).
        tile = page.inner_text(dead_tile)
        panel = page.inner_text(".mnb-dashboard .mnb-failures")
        colour = page.eval_on_selector(dead_tile, "e => getComputedStyle(e).backgroundColor")
        # Selecting the failed rank shows its last lines of output.
        page.click(".mnb-dashboard .mnb-failure-panel button:has-text('rank 1')")
        page.wait_for_selector(".mnb-dashboard .mnb-output[data-rank='1']", **wait)
        ARTIFACTS.mkdir(exist_ok=True)
        shot = tmp_path / "dashboard.png"
        page.locator(".mnb-dashboard").screenshot(path=str(shot))
        shutil.copy(shot, ARTIFACTS / "dashboard.png")
        survivor = page.inner_text(".mnb-dashboard .mnb-tile[data-rank='0']")
        heights = page.eval_on_selector_all(
            ".mnb-dashboard .mnb-tile", "tiles => tiles.map(t => t.offsetHeight)"
        )
        page.click(".mnb-dashboard .mnb-clear-failures")
        page.wait_for_selector(".mnb-dashboard .mnb-failures.mnb-none", **wait)
    assert "rank 1" in tile
    assert "dead" in tile
    assert "SIGKILL" in tile
    assert colour == "rgb(198, 40, 40)"  # red
    assert "rank 1" in panel
    assert "was killed by signal SIGKILL" in panel
    assert panel.index("SIGKILL") < panel.index("ranks 0-1") < panel.index("on every rank")
    assert len(set(heights)) == 1  # a dead tile is as tall as an idle one
    assert "rank 0 failed" in survivor  # its last cell raised; its process lives on
    assert "dead" not in survivor


SPINNING = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2",
    # Rank 1 spins for a while; rank 0 sleeps: the cell keeps the kernel busy.
    "%%mesh\nimport time\nend = time.monotonic() + 90\n"
    "while rank == 1 and time.monotonic() < end:\n    pass\ntime.sleep(0 if rank == 1 else 90)",
    "%mesh stop",
]
_SPARK = ".mnb-dashboard .mnb-tile[data-rank='{}'] .mnb-spark"
_LEVEL = """sel => {
    const spark = document.querySelector(sel);
    if (!spark) return -1;
    return Math.max(...[...spark.innerText].map(c => '▁▂▃▄▅▆▇█'.indexOf(c)));
}"""


def test_sparklines_and_the_chart_move_while_a_cell_runs(tmp_path: Path) -> None:
    wait = {"timeout": 90_000}
    served = served_notebook(tmp_path, SPINNING, name="sparklines.ipynb")
    with served as url, notebook_page(url) as page:
        page.keyboard.press("Shift+Enter")  # %mesh start: the dashboard
        page.wait_for_selector(_SPARK.format(1), **wait)  # two heartbeats in
        before = page.inner_text(_SPARK.format(1))
        page.keyboard.press("Shift+Enter")  # the spinning cell
        page.wait_for_selector(".jp-Cell .jp-InputPrompt:has-text('[*]')", **wait)
        # Rank 1's sparkline climbs while rank 0's stays low, and the chart
        # (bqplot, in its own SVG) draws a line per rank.
        page.wait_for_function(
            f"() => ({_LEVEL})(`{_SPARK.format(1)}`) >= 2"
            f" && ({_LEVEL})(`{_SPARK.format(1)}`) > ({_LEVEL})(`{_SPARK.format(0)}`)",
            **wait,
        )
        page.wait_for_selector(".mnb-dashboard .mnb-chart svg .curve path.line", **wait)
        during = page.inner_text(_SPARK.format(1))
        still_running = page.locator(".jp-Cell .jp-InputPrompt:has-text('[*]')").count()
        lines = page.locator(".mnb-dashboard .mnb-chart svg .curve path.line").count()
        legend = page.text_content(".mnb-dashboard .mnb-chart svg .g_legend") or ""
        ARTIFACTS.mkdir(exist_ok=True)
        shot = tmp_path / "sparklines.png"
        page.locator(".mnb-dashboard").screenshot(path=str(shot))
        shutil.copy(shot, ARTIFACTS / "sparklines.png")
    assert during != before
    assert still_running == 1  # it moved while the cell held the kernel
    assert lines >= 2
    assert "rank 0" in legend
    assert "rank 1" in legend
