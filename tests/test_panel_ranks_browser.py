"""The Mesh panel after a rank died, in JupyterLab in headless Chromium: the dead
rank shows no CPU or memory, nothing is said twice, and a click on the rank gives
its actions (its log, restart it alone, debug); a result line goes when a new
failure comes. A click on the rank's dashboard tile picks it for the dashboard's
actions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_harness import SKIP_WITHOUT_CHROMIUM, notebook_page, served_notebook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), SKIP_WITHOUT_CHROMIUM]

ARTIFACTS = Path(__file__).parent / "artifacts"
CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2 --name mesh",
    "%%mesh\nprint('hello from', rank)",
    "from monarch_nb import current_mesh\ncurrent_mesh().procs.kill([1])",
    "%%mesh --ranks 0\n1 / 0",  # a later failure
    "%mesh stop --all",
]


def _panel_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any(
        Path(p, "monarch-nb", "package.json").exists() for p in jupyter_path("labextensions")
    )


def test_a_dead_ranks_actions_in_the_panel(tmp_path: Path) -> None:
    if not _panel_installed():
        pytest.skip("the Mesh panel is not built: install with Node.js on PATH (pip install -e .)")
    wait = {"timeout": 60_000}
    with served_notebook(tmp_path, CELLS, name="ranks.ipynb") as url, notebook_page(url) as page:
        try:
            for _ in CELLS[1:4]:
                page.keyboard.press("Shift+Enter")
            page.click('.jp-SideBar [data-id="monarch-nb-panel"]')
            panel = page.locator("#monarch-nb-panel")
            mesh = panel.locator('.jp-MonarchNb-mesh[data-mesh="mesh"]')
            dead = mesh.locator('tr.jp-MonarchNb-rank[data-rank="1"][data-state="dead"]')
            dead.wait_for(**wait)
            # A dead process has no CPU or memory to show.
            assert dead.locator("td.jp-MonarchNb-cpu").inner_text() == "-"
            assert dead.locator("td.jp-MonarchNb-rss").inner_text() == "-"
            lines = [line for line in panel.inner_text().splitlines() if len(line) > 30]
            assert len(lines) == len(set(lines)), lines  # no long message twice
            mesh.locator(".jp-MonarchNb-rankHint").wait_for(**wait)

            # In the dashboard, a click on a tile picks that rank for the actions bar.
            dashboard = page.locator(".mnb-dashboard").first
            dashboard.locator('.mnb-tile[data-rank="1"]').click()
            dashboard.locator(".mnb-action-logs").click()
            dashboard.locator(
                '.mnb-action-result[data-action="logs"][data-rank="1"]', has_text="hello from 1"
            ).wait_for(**wait)

            # Its actions: the log, then a restart of this rank alone (asked first).
            dead.click()
            actions = mesh.locator('.jp-MonarchNb-rankActions[data-rank="1"]')
            actions.wait_for(**wait)
            actions.locator('button[data-action="logs"]').click()
            mesh.locator(".jp-MonarchNb-rankDetail", has_text="hello from 1").wait_for(**wait)
            actions.locator('button[data-action="restart"]').click()
            dialog = page.locator(".jp-Dialog")
            dialog.locator("text=Restart rank 1 of 'mesh'?").wait_for(**wait)
            dialog.locator(".jp-mod-accept").click()
            restarted = panel.locator(".jp-MonarchNb-message", has_text="rank 1 restarted in")
            restarted.wait_for(**wait)
            mesh.locator('tr.jp-MonarchNb-rank[data-rank="1"][data-state="idle"]').wait_for(**wait)

            # A new failure: the "restarted" line is news no more.
            cell = page.locator(".jp-Notebook .jp-Cell").nth(4)
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            mesh.locator('tr.jp-MonarchNb-rank[data-rank="0"][data-state="failed"]').wait_for(
                **wait
            )
            restarted.wait_for(state="detached", **wait)

            # debug: the rank's stack, and the cell that opens pdb, inserted to run.
            mesh.locator('tr.jp-MonarchNb-rank[data-rank="0"]').click()
            actions = mesh.locator('.jp-MonarchNb-rankActions[data-rank="0"]')
            actions.locator('button[data-action="debug"]').click()
            page.locator(
                ".jp-Notebook .jp-Cell .jp-InputArea-editor",
                has_text="%mesh debug --rank 0 --mesh mesh",
            ).wait_for(**wait)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "panel_rank_actions.png"))
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "panel_rank_actions_failure.png"))
            raise
        finally:
            # Stop the mesh from the kernel (the cell that says so, wherever the
            # inserted one put it) and wait for its prompt to show it ran.
            stop = page.locator(".jp-Notebook .jp-Cell", has_text="%mesh stop --all")
            stop.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            ran = re.compile(r"\[\d+\]")
            stop.locator(".jp-InputPrompt", has_text=ran).wait_for(timeout=30_000)
