"""What the browser tests share: a Jupyter server on loopback and headless Chromium.

The server gets a random token through its environment (never on the command
line) and, for JupyterLab, a workspace and settings directory of its own, so
no tab of another run's notebook is restored over the one under test.
Chromium is Debian's (``.ci/run`` installs it), driven by Playwright.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SKIP_WITHOUT_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on this machine (.ci/run installs it)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served_notebook(
    directory: Path, cells: list[str], *, name: str = "ui.ipynb", app: str = "lab"
) -> Iterator[str]:
    """The URL of a notebook of ``cells`` in ``app`` (lab or notebook), served on loopback."""
    pytest.importorskip("jupyterlab" if app == "lab" else "notebook")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(notebook, directory / name)
    port, token = free_port(), secrets.token_hex(16)
    command = [
        sys.executable, "-m", "jupyter", app, "--no-browser", "--ip=127.0.0.1",
        f"--port={port}", f"--ServerApp.root_dir={directory}", "--allow-root",
    ]  # fmt: skip
    if app == "lab":
        # No "get notified about Jupyter news?" toast over the screenshots (and no
        # request to a news site from a test).
        news = directory / "settings" / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True, exist_ok=True)
        (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        command += [
            f"--LabApp.workspaces_dir={directory / 'workspaces'}",
            f"--LabApp.user_settings_dir={directory / 'settings'}",
        ]
    log_path = directory / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            command,
            env=dict(os.environ, JUPYTER_TOKEN=token),  # the token stays off the command line
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        log.flush()
                        tail = log_path.read_text()[-2000:]
                        pytest.fail(f"the Jupyter server did not start:\n{tail}")
                    time.sleep(0.1)
            path = f"lab/tree/{name}" if app == "lab" else f"notebooks/{name}"
            yield f"http://127.0.0.1:{port}/{path}?token={token}"
        finally:
            server.terminate()  # shuts its kernels down, and they stop their meshes
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


_FIRST_CELL_RAN = """() => /\\[\\d+\\]/.test(
    document.querySelector('.jp-Notebook .jp-Cell .jp-InputPrompt').innerText)"""


def run_first_cell_once_the_kernel_is_up(page) -> None:
    """Shift+Enter on the first cell until it shows an execution count.

    A front end that is still connecting its kernel moves on to the next cell
    without running anything; a user would simply run the cell again.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(20):
        # On a loaded machine JupyterLab may ask which kernel to start (its kernel
        # specs arrived late); the preferred one is selected: accept it, as a user would.
        select_kernel = page.locator(".jp-Dialog:has-text('Select Kernel') .jp-mod-accept")
        if select_kernel.count():
            select_kernel.first.click()
        page.click(".jp-Notebook .jp-Cell >> nth=0")
        page.keyboard.press("Shift+Enter")
        try:
            page.wait_for_function(_FIRST_CELL_RAN, timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    pytest.fail("the notebook's kernel never ran the first cell")


@contextlib.contextmanager
def notebook_page(url: str, *, width: int = 1200, height: int = 1000) -> Iterator[Any]:
    """A Chromium page on the notebook at ``url``, its first cell run once the kernel is up."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            run_first_cell_once_the_kernel_is_up(page)
            yield page
        finally:
            browser.close()
