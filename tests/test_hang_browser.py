"""A collective hang in JupyterLab in headless Chromium, as a user meets it (issue 62,
items 1 to 3): rank 1 skips an ``all_reduce`` that rank 0 enters.

Before anyone presses stop, rank 1's dashboard tile says it never joined, and
the actions bar under the tiles has picked rank 1 and shows what its "why"
would (the diagnosis, every rank's place: its buttons cannot answer while the
cell holds the kernel). Then the kernel's
stop button (the toolbar's interrupt): rank 0 does not stop within the grace,
is killed and replaced, and the cell says so with that same verdict, naming
itself by the number JupyterLab shows beside it; the mesh is usable at once,
and the dashboard lists rank 0's death once, as monarch_nb's kill.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_harness import SKIP_WITHOUT_CHROMIUM, notebook_page, served_notebook

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), SKIP_WITHOUT_CHROMIUM]

ARTIFACTS = Path(__file__).parent / "artifacts"
CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2 --dist gloo",
    "%%mesh\nx = torch.ones(2)\nif rank == 0:\n    dist.all_reduce(x)",
    "%%mesh\ny = torch.ones(1)\ndist.all_reduce(y)\ny",
    "%mesh stop",
]
VERDICT = re.compile(r"→ rank 1 never entered all_reduce #\d+ \(idle: [^\n<]*")


def _verdict(text: str) -> str:
    found = VERDICT.search(text)
    assert found, f"no verdict naming rank 1 in:\n{text}"
    return found.group(0)


def test_a_hang_is_named_on_its_tile_before_stop_and_stop_says_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel inherits the server's environment: a 1 s grace, and the dashboard
    # suspects a hang after 1 s of rank 0 busy while rank 1 is not.
    monkeypatch.setenv("MONARCH_NB_INTERRUPT_GRACE", "1")
    monkeypatch.setenv("MONARCH_NB_HANG_AFTER", "1")
    # gloo gives up on the collective after this (60 s by default): never before
    # the stop, on however loaded a machine.
    monkeypatch.setenv("MONARCH_NB_COLLECTIVE_TIMEOUT", "300")
    wait = {"timeout": 90_000}
    served = served_notebook(tmp_path, CELLS, name="hang.ipynb")
    with served as url, notebook_page(url, height=1200) as page:
        try:
            dashboard = page.locator(".mnb-dashboard").first
            page.keyboard.press("Shift+Enter")  # %mesh start: the dashboard
            dashboard.locator(".mnb-tile[data-rank='1']").wait_for(**wait)
            page.keyboard.press("Shift+Enter")  # the cell rank 1 leaves early
            cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
            # Live, while the cell runs: rank 1's tile, and the bar picked for it.
            mark = dashboard.locator(".mnb-tile[data-rank='1'] .mnb-hang")
            mark.wait_for(**wait)
            tile = mark.inner_text()
            # A tile's work comes with its rank's heartbeats: rank 0's may still show
            # the torch.distributed setup that %mesh start ran, a beat behind.
            busy = dashboard.locator(".mnb-tile[data-rank='0']", has_text="%%mesh cell [")
            busy.wait_for(**wait)
            busy_text = busy.inner_text()
            offer = dashboard.locator(".mnb-action-result[data-action='offer'][data-rank='1']")
            offer.wait_for(**wait)
            diagnosis = offer.inner_text()
            picked = dashboard.locator(".mnb-rank-actions select").evaluate(
                "s => s.options[s.selectedIndex].textContent.replace(/\\u00a0/g, ' ')"
            )
            assert cell.locator(".jp-InputPrompt").inner_text().strip() == "[*]:"
            ARTIFACTS.mkdir(exist_ok=True)
            page.locator(".mnb-dashboard").first.screenshot(path=str(ARTIFACTS / "hang_tile.png"))

            # The stop button: rank 0 is stuck in C, so killed and replaced.
            page.click('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]')
            cell.locator(".jp-OutputArea-output", has_text="StuckRanksKilled").wait_for(**wait)
            stopped = cell.locator(".jp-OutputArea").inner_text()
            prompt = cell.locator(".jp-InputPrompt").inner_text()
            # The mesh is usable without a restart: both ranks join an all_reduce.
            usable = page.locator(".jp-Notebook .jp-Cell").nth(3)
            usable.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            usable.locator(".jp-OutputArea-output", has_text="[0-1] tensor([2.])").wait_for(**wait)
            mark.wait_for(state="detached", **wait)  # no hang any more, no mark
            # Rank 0's death is listed once, as monarch_nb's kill, not as a crash.
            dashboard.locator(
                ".mnb-failure[data-rank='0']", has_text="was killed by monarch_nb"
            ).wait_for(**wait)
            failures = dashboard.locator(".mnb-failures").inner_text()
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "hang_failure.png"))
            raise
        finally:
            stop = page.locator(".jp-Notebook .jp-Cell").nth(4)
            stop.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            stop.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(
                timeout=60_000
            )
    assert "never joined all_reduce" in tile
    assert "rank 0 waits" in tile
    # One diagnosis everywhere: what the bar shows unasked (its "why", which a
    # button could not answer while the cell holds the kernel) and the stop's message.
    assert picked == "rank 1", picked
    verdict = _verdict(diagnosis)
    assert "rank 1 not in it: idle" in diagnosis
    assert "rank 0 waiting in all_reduce" in diagnosis
    assert diagnosis.startswith("a hang: %mesh why, read now (stop interrupts the ranks, then")
    assert "those still waiting 1 s later" in diagnosis
    assert _verdict(stopped) == verdict
    assert "every rank is in the collective" not in stopped
    assert "rank(s) 0 did not stop within 1.0 s of the interrupt" in stopped
    assert "monarch_nb replaced rank(s) 0 with fresh processes" in stopped
    assert "rank(s) 1 keep their state" in stopped
    assert failures.count("killed by monarch_nb") == 1, failures
    assert "SIGKILL" not in failures
    # Cells are named by the number JupyterLab shows beside them (item 2).
    number = re.fullmatch(r"\[(\d+)\]:", prompt.strip())
    assert number, prompt
    assert f"%%mesh cell [{number.group(1)}]" in stopped
    assert f"%%mesh cell [{number.group(1)}]" in busy_text  # rank 0's tile, while it waited
