"""%%mesh in real front ends: JupyterLab and Notebook 7 in headless Chromium.

A Jupyter server on loopback serves a small notebook; Chromium, driven by
Playwright, runs its cells with Shift+Enter the way a user does, and the test
reads what the page shows: the status table, rank output streaming in while
the cell runs, folded values, the aggregated remote traceback.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium on this machine (.ci/run installs it)"
    ),
]

CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2",
    "%%mesh\nimport time\nfor i in range(3):\n"
    "    print(f'rank {rank} step {i}', flush=True)\n    time.sleep(1.0)\nrank * 10",
    "%%mesh\n1 / (rank - 1)",
    "%mesh stop",
]
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["lab", "notebook"], ids=["jupyterlab", "notebook7"])
def served_notebook(request, tmp_path: Path) -> Iterator[str]:
    """URL of a notebook of CELLS, served by a Jupyter server on loopback."""
    app = request.param
    pytest.importorskip("jupyterlab" if app == "lab" else "notebook")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(notebook, tmp_path / "ui.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in the teardown below
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", app, "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--ServerApp.root_dir={tmp_path}", "--allow-root"],
        env=dict(os.environ, JUPYTER_TOKEN=token),  # the token stays off the command line
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail(f"the Jupyter server did not start:\n{_tail(tmp_path)}")
                time.sleep(0.1)
        path = "lab/tree/ui.ipynb" if app == "lab" else "notebooks/ui.ipynb"
        yield f"http://127.0.0.1:{port}/{path}?token={token}"
    finally:
        server.terminate()  # shuts its kernels down, and they stop their meshes
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


_FIRST_CELL_RAN = """() => /\\[\\d+\\]/.test(
    document.querySelector('.jp-Notebook .jp-Cell .jp-InputPrompt').innerText)"""


def run_first_cell_once_the_kernel_is_up(page) -> None:
    """Shift+Enter on the first cell until it shows an execution count.

    A front end that is still connecting its kernel moves on to the next cell
    without running anything; a user would simply run the cell again.
    """
    for _ in range(20):
        page.click(".jp-Notebook .jp-Cell >> nth=0")
        page.keyboard.press("Shift+Enter")
        try:
            page.wait_for_function(_FIRST_CELL_RAN, timeout=5_000)
            return
        except playwright.TimeoutError:
            continue
    pytest.fail("the notebook's kernel never ran the first cell")


def _tail(directory: Path) -> str:
    return (directory / "server.log").read_text()[-2000:]


def test_a_mesh_cell_in_a_real_browser(served_notebook: str) -> None:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            page.goto(served_notebook)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            run_first_cell_once_the_kernel_is_up(page)
            for _ in CELLS[1:-1]:
                page.keyboard.press("Shift+Enter")  # queued in the kernel, run in order

            wait = {"timeout": 90_000}
            page.wait_for_selector("text=running · 2 ranks", **wait)
            page.wait_for_selector("text=[0] rank 0 step 0", **wait)
            # Live: the first line is on the page while the cell still runs.
            assert not page.is_visible("text=[0] rank 0 step 2")
            page.wait_for_selector("text=[1] 10", **wait)
            page.wait_for_selector("text=%%mesh cell <mesh-cell-2> failed on rank(s) 1", **wait)
            # An error stops the cells queued after it, as in any notebook: run the last now.
            page.keyboard.press("Shift+Enter")
            page.wait_for_selector("text=mesh 'mesh' stopped", **wait)
            text = page.inner_text(".jp-Notebook")
        finally:
            browser.close()
    assert "[0] 0\n[1] 10" in text
    assert "ZeroDivisionError: division by zero" in text
    assert "1 / (rank - 1)" in text  # the cell's own line, in the remote traceback
