"""%%mesh in real front ends: JupyterLab and Notebook 7 in headless Chromium.

A Jupyter server on loopback serves a small notebook; Chromium, driven by
Playwright, runs its cells with Shift+Enter the way a user does, and the test
reads what the page shows: the status table, rank output streaming in while
the cell runs, folded values, the aggregated remote traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_harness import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    SKIP_WITHOUT_CHROMIUM,
    notebook_page,
    run_first_cell_once_the_kernel_is_up,
    served_notebook,
)

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), SKIP_WITHOUT_CHROMIUM]

CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2",
    "%%mesh\nimport time\nfor i in range(3):\n"
    "    print(f'rank {rank} step {i}', flush=True)\n    time.sleep(1.0)\nrank * 10",
    "%%mesh\n1 / (rank - 1)",
    "%mesh stop",
]


@pytest.fixture(params=["lab", "notebook"], ids=["jupyterlab", "notebook7"])
def notebook_url(request, tmp_path: Path) -> Iterator[str]:
    """URL of a notebook of CELLS, in JupyterLab and in Notebook 7."""
    with served_notebook(tmp_path, CELLS, app=request.param) as url:
        yield url


def test_a_mesh_cell_in_a_real_browser(notebook_url: str) -> None:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            page.goto(notebook_url)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            run_first_cell_once_the_kernel_is_up(page)
            for _ in CELLS[1:-1]:
                page.keyboard.press("Shift+Enter")  # queued in the kernel, run in order

            wait = {"timeout": 90_000}
            # In the notebook: the Mesh side panel, hidden, carries the same words.
            page.wait_for_selector(".jp-Notebook >> text=running · 2 ranks", **wait)
            page.wait_for_selector("text=[0] rank 0 step 0", **wait)
            # Live: the first line is on the page while the cell still runs.
            assert not page.is_visible("text=[0] rank 0 step 2")
            page.wait_for_selector("text=[1] 10", **wait)
            # Named by the notebook's own count: the fourth cell run is In [4].
            page.wait_for_selector("text=CellError: %%mesh cell [4] failed on rank(s) 1", **wait)
            failed = _prompt_number(page, 3)
            # An error stops the cells queued after it, as in any notebook: run the last now.
            page.keyboard.press("Shift+Enter")
            page.wait_for_selector("text=mesh 'mesh' stopped", **wait)
            text = page.inner_text(".jp-Notebook")
        finally:
            browser.close()
    assert "[0] 0\n[1] 10" in text
    # ... as the page shows it beside the cell.
    assert f"CellError: %%mesh cell [{failed}] failed on rank(s) 1" in text
    assert "ZeroDivisionError: division by zero" in text
    assert "1 / (rank - 1)" in text  # the cell's own line, in the remote traceback


def _prompt_number(page, index: int) -> str:
    """N of the ``[N]:`` the front end shows beside its cell ``index`` once it ran."""
    prompt = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputPrompt")
    prompt.filter(has_text=re.compile(r"\[\d+\]")).wait_for(timeout=90_000)
    return re.search(r"\[(\d+)\]", prompt.inner_text()).group(1)


ARTIFACTS = Path(__file__).parent / "artifacts"
RICH_CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2 --no-dashboard",
    "%%mesh\nimport matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2))\n"
    "plt.plot([0, rank + 1])\nplt.title(f'figure of rank {rank}')\nplt.show()",
    # A progress bar per rank (tqdm draws the same \r lines).
    "%%mesh --live\nimport sys, time\nfor i in range(1, 11):\n"
    "    sys.stderr.write(f'\\r{i * 10:3d}%|' + '#' * i + f'| {i}/10')\n"
    "    sys.stderr.flush()\n    time.sleep(0.05)\n_ = sys.stderr.write('\\n')",
    # Rank 0 runs on until the test, having seen rank 1's failure, writes `go`.
    "%%mesh\nimport os, time\nif rank == 1:\n    raise ValueError('rank 1 broke')\n"
    "while not os.path.exists('go'):\n    time.sleep(0.05)\n'rank 0 finished'",
    "%mesh stop",
]


@pytest.fixture
def rich_notebook(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with served_notebook(tmp_path, RICH_CELLS, name="rich.ipynb") as url:
        yield url, tmp_path


def test_figures_and_a_live_failure_in_jupyterlab(rich_notebook: tuple[str, Path]) -> None:
    url, directory = rich_notebook
    wait = {"timeout": 90_000}
    with notebook_page(url, height=1400) as page:
        for _ in RICH_CELLS[1:-1]:
            page.keyboard.press("Shift+Enter")
        # One figure per rank, each labelled with its rank, as images on the page.
        page.wait_for_selector(".monarch-nb-rank >> text=[rank 1]", **wait)
        images = page.locator(".jp-OutputArea-output img[src^='data:image/png']")
        images.nth(1).wait_for(**wait)
        widths = [images.nth(i).evaluate("img => img.naturalWidth") for i in range(2)]
        # The progress bars are widgets, one per rank in rank order, left at their end.
        bars = page.locator(".mnb-progress")
        bars.nth(1).wait_for(**wait)
        # Each rank's last update comes when it comes: wait for both.
        page.wait_for_selector(".mnb-progress >> text=[0] 100%", **wait)
        page.wait_for_selector(".mnb-progress >> text=[1] 100%", **wait)
        bar_texts = bars.all_inner_texts()
        # Rank 1's failure is on the page while rank 0 still runs the cell.
        page.wait_for_selector(
            "text=[1] failed: ValueError: rank 1 broke (rank(s) 0 still running", **wait
        )
        assert not page.is_visible("text=CellError")
        (directory / "go").touch()
        page.wait_for_selector("text=rank(s) 0 succeeded", **wait)
        failed = _prompt_number(page, 4)
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(".jp-Notebook").screenshot(path=str(ARTIFACTS / "rich_output.png"))
        text = page.inner_text(".jp-Notebook")
    assert all(width > 100 for width in widths)  # real pictures, not broken images
    assert "CellError: %%mesh cell [5] failed on rank(s) 1" in text
    assert failed == "5"  # the number beside the cell on the page
    assert bar_texts == ["[0] 100%|##########| 10/10", "[1] 100%|##########| 10/10"]
    assert "[0] 'rank 0 finished'" in text  # the value of the rank that succeeded


WIDGET_CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2 --no-dashboard",
    "%%mesh\nfrom tqdm.notebook import tqdm\nfor _ in tqdm(range(4), desc=f'rank {rank}'):\n"
    "    pass",
    "%%mesh\nimport ipywidgets\n"
    "slider = ipywidgets.IntSlider(value=10 + rank, description=f'rank {rank}')\n"
    "display(slider)",
    "%%mesh\nprint('slider at', slider.value)",
    "%mesh stop",
]


@pytest.fixture
def widget_notebook(tmp_path: Path) -> Iterator[str]:
    with served_notebook(tmp_path, WIDGET_CELLS, name="widgets.ipynb") as url:
        yield url


def test_widgets_made_on_ranks_render_and_answer_in_jupyterlab(widget_notebook: str) -> None:
    wait = {"timeout": 90_000}
    with notebook_page(widget_notebook, height=1200) as page:
        page.keyboard.press("Shift+Enter")  # %mesh start
        page.keyboard.press("Shift+Enter")  # the tqdm.notebook bars
        page.keyboard.press("Shift+Enter")  # the sliders
        # Real widgets, drawn by JupyterLab's widget manager from the ranks' models.
        page.wait_for_selector(".jp-OutputArea-output .widget-hprogress >> nth=1", **wait)
        page.wait_for_selector("text=rank 0: 100%", **wait)
        page.wait_for_selector("text=rank 1: 100%", **wait)
        sliders = page.locator(".jp-OutputArea-output .widget-slider")
        sliders.nth(1).wait_for(**wait)
        readouts = page.locator(".jp-OutputArea-output .widget-readout")
        assert sorted(readouts.all_inner_texts()) == ["10", "11"]  # live: in any order
        # The user moves rank 0's slider one step; rank 0 sees it, rank 1 does not.
        rank0 = page.locator(".jp-OutputArea-output .widget-slider", has_text="rank 0")
        rank0.locator(".noUi-handle").focus()
        page.keyboard.press("ArrowRight")
        rank0.locator(".widget-readout >> text=11").wait_for(**wait)
        page.locator(".jp-Cell").nth(4).click()  # the print cell
        page.keyboard.press("Shift+Enter")
        page.wait_for_selector("text=[0] slider at 11", **wait)
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(".jp-Notebook").screenshot(path=str(ARTIFACTS / "rank_widgets.png"))
        text = page.inner_text(".jp-Notebook")
    assert "[1] slider at 11" in text
