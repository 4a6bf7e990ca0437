"""The JupyterLab Mesh panel: its kernel side (snapshots, actions, the comm) and the
panel itself in JupyterLab in headless Chromium (see test_browser.py for how).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_utils import Kernel, wait_gone
from polling import read_until

from monarch_nb.magics._panel import COMM_TARGET, panel_snapshot, run_action
from monarch_nb.magics._registry import REGISTRY

ARTIFACTS = Path(__file__).parent / "artifacts"  # gitignored: screenshots of UI tests


@pytest.fixture
def mesh() -> Iterator:
    mesh = REGISTRY.start(procs=2, name=f"panel-{uuid.uuid4().hex[:6]}")
    yield mesh
    if mesh.state != "stopped":
        mesh.stop()


def test_snapshot_of_a_real_mesh(mesh) -> None:
    snapshot = json.loads(json.dumps(panel_snapshot()))  # JSON as it is, no custom encoder
    [entry] = [m for m in snapshot["meshes"] if m["name"] == mesh.name]
    assert snapshot["type"] == "snapshot"
    assert entry["state"] == "running"
    assert entry["default"] is True
    assert entry["shape"] == {"procs": 2}
    assert [r["rank"] for r in entry["ranks"]] == [0, 1]
    assert [r["pid"] for r in entry["ranks"]] == mesh.procs.pids
    assert {r["state"] for r in entry["ranks"]} <= {"starting", "idle"}
    assert entry["ranks"][1]["point"] == {"procs": 1}
    assert snapshot["failures"] == []

    with pytest.raises(Exception, match="division by zero"):
        mesh.run("1 / (rank - 1)")
    snapshot = panel_snapshot()
    [entry] = [m for m in snapshot["meshes"] if m["name"] == mesh.name]
    assert entry["ranks"][1]["state"] == "failed"
    [failure] = snapshot["failures"]
    assert (failure["mesh"], failure["rank"]) == (mesh.name, 1)
    assert "ZeroDivisionError" in failure["failure"]


def test_actions_stop_a_mesh_and_report_bad_requests(mesh) -> None:
    pids = mesh.procs.pids
    assert run_action("interrupt", mesh.name)["message"] == "no rank was busy"
    result = run_action("stop", mesh.name)
    assert result == {
        "type": "result",
        "action": "stop",
        "mesh": mesh.name,
        "ok": True,
        "message": f"mesh {mesh.name!r} stopped",
    }
    assert mesh.name not in [m["name"] for m in panel_snapshot()["meshes"]]
    wait_gone(pids)
    gone = run_action("restart", mesh.name)
    assert gone["ok"] is False
    assert f"no mesh named {mesh.name!r}" in gone["message"]
    assert "unknown action 'explode'" in run_action("explode", mesh.name)["message"]


def _comm_messages(kernel: Kernel, comm_id: str, until, timeout: float = 30) -> list[dict]:
    """The data of comm_msg messages on ``comm_id`` until ``until(data)`` is true."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            continue
        if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == comm_id:
            seen.append(msg["content"]["data"])
            if until(msg["content"]["data"]):
                return seen
    raise TimeoutError(f"no matching comm message within {timeout} s; got {seen!r}")


def test_the_comm_in_a_real_kernel() -> None:
    with Kernel() as kernel:
        kernel.ok("%load_ext monarch_nb")
        kernel.ok("%mesh start --procs 2")
        pids = kernel.worker_pids()
        comm_id = uuid.uuid4().hex
        client = kernel.client
        client.shell_channel.send(
            client.session.msg("comm_open", {"comm_id": comm_id, "target_name": COMM_TARGET,
                                             "data": {}})
        )  # fmt: skip
        [*_, snapshot] = _comm_messages(kernel, comm_id, lambda d: d["type"] == "snapshot")
        [entry] = snapshot["meshes"]
        assert (entry["name"], len(entry["ranks"])) == ("mesh", 2)

        client.shell_channel.send(
            client.session.msg("comm_msg", {"comm_id": comm_id,
                                            "data": {"action": "stop", "mesh": "mesh"}})
        )  # fmt: skip
        seen = _comm_messages(
            kernel, comm_id, lambda d: d["type"] == "snapshot" and not d["meshes"]
        )
        results = [d for d in seen if d["type"] == "result"]
        assert results[0]["message"] == "mesh 'mesh' stopped"
        wait_gone(pids)


def test_the_dashboard_goes_to_the_side_panel_when_one_is_connected() -> None:
    with Kernel() as kernel:
        kernel.ok("%load_ext monarch_nb")
        kernel.ok("%mesh start --procs 1 --no-dashboard")
        # No panel yet (Notebook 7, VS Code): the dashboard is shown in the cell.
        alone = kernel.ok("%mesh dashboard --side")
        assert "no JupyterLab Mesh panel is connected" in alone.text()
        views = [
            d for d in alone.displays() if "application/vnd.jupyter.widget-view+json" in d["data"]
        ]
        assert len(views) == 1

        comm_id, client = uuid.uuid4().hex, kernel.client
        client.shell_channel.send(
            client.session.msg("comm_open", {"comm_id": comm_id, "target_name": COMM_TARGET,
                                             "data": {}})
        )  # fmt: skip
        _comm_messages(kernel, comm_id, lambda d: d["type"] == "snapshot")
        msg_id = kernel.execute("%mesh dashboard --side", wait=False)
        shown, reveals, idle = [], [], False
        deadline = time.monotonic() + 60
        while not (idle and reveals) and time.monotonic() < deadline:
            try:
                msg = client.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                continue
            if msg["msg_type"] == "comm_msg" and msg["content"]["data"]["type"] == "reveal":
                reveals.append(msg["content"]["data"])
            elif msg["parent_header"].get("msg_id") != msg_id:
                continue
            elif msg["msg_type"] == "display_data":
                shown.append(msg["content"]["data"])
            elif msg["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
        assert reveals == [{"type": "reveal", "mesh": "mesh"}]
        # the notice only: no dashboard widget in the cell
        assert [d["text/plain"] for d in shown] == ["mesh 'mesh' is in the Mesh side panel"]
        kernel.ok("%mesh stop")


def _control_request(kernel: Kernel, msg_type: str, content: dict) -> dict:
    client = kernel.client
    msg = client.session.msg(msg_type, content)
    client.control_channel.send(msg)
    while True:
        reply = client.get_control_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]


def test_a_button_is_answered_after_the_subshell_it_came_from_is_gone() -> None:
    # JupyterLab >= 4.4 sends a comm's messages on a subshell of its comm target and
    # can delete that subshell while a reopened comm still names it; ipykernel >= 7.4
    # then routes the comm's next message to the subshell its last reply went to.
    # Unless the panel's comm keeps to the main shell, "stop" is dropped there
    # ("Unknown subshell_id") and the panel waits for an answer forever.
    with Kernel() as kernel:
        if "supported_features" not in kernel.client.kernel_info(reply=True)["content"]:
            pytest.skip("this ipykernel has no subshells")
        kernel.ok("%load_ext monarch_nb")
        kernel.ok("%mesh start --procs 2")
        pids = kernel.worker_pids()
        subshell = _control_request(kernel, "create_subshell_request", {})["subshell_id"]
        client, comm_id = kernel.client, uuid.uuid4().hex

        def send(msg_type: str, content: dict) -> None:
            msg = client.session.msg(msg_type, content)
            msg["header"]["subshell_id"] = subshell
            client.shell_channel.send(msg)

        send("comm_open", {"comm_id": comm_id, "target_name": COMM_TARGET, "data": {}})
        _comm_messages(kernel, comm_id, lambda d: d["type"] == "snapshot")
        send("comm_msg", {"comm_id": comm_id, "data": {"action": "interrupt", "mesh": "mesh"}})
        _comm_messages(kernel, comm_id, lambda d: d["type"] == "result")
        assert (
            _control_request(kernel, "delete_subshell_request", {"subshell_id": subshell})["status"]
            == "ok"
        )

        send("comm_msg", {"comm_id": comm_id, "data": {"action": "stop", "mesh": "mesh"}})
        seen = _comm_messages(kernel, comm_id, lambda d: d["type"] == "result")
        assert seen[-1]["message"] == "mesh 'mesh' stopped"
        wait_gone(pids)


def test_a_front_end_without_the_panel_hears_nothing_of_it(tmp_path: Path) -> None:
    # nbconvert (like nbval) has no handler for the panel's comm target: a comm the
    # kernel opened to it would be answered with a warning on every run.
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(src)
        for src in ("%load_ext monarch_nb", "%mesh start --procs 1", "%mesh stop")
    ]
    path = tmp_path / "no_panel.ipynb"
    nbformat.write(notebook, path)
    out = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "comm target" not in out.stderr, out.stderr


# -- the panel in JupyterLab, in headless Chromium -------------------------------------

CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2",
    "%%mesh\nrank * 10",
    "%%mesh --ranks 1 --no-block\nimport time\ntime.sleep(60)",
    "%mesh dashboard --side",  # run later, with the panel closed
]


def _panel_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any(
        Path(p, "monarch-nb", "package.json").exists() for p in jupyter_path("labextensions")
    )


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    """URL of a notebook of CELLS in JupyterLab, served on loopback with a token."""
    from browser_harness import served_notebook

    with served_notebook(tmp_path, CELLS, name="panel.ipynb") as url:
        yield url


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_mesh_panel_in_jupyterlab(lab: str) -> None:
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from browser_harness import CHROMIUM, CHROMIUM_FLAGS, run_first_cell_once_the_kernel_is_up

    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (.ci/run installs it)")
    if not _panel_installed():
        pytest.skip("the Mesh panel is not built: install with Node.js on PATH (pip install -e .)")
    wait = {"timeout": 60_000}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        try:
            page.goto(lab)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            run_first_cell_once_the_kernel_is_up(page)
            for _ in CELLS[1:-1]:
                page.keyboard.press("Shift+Enter")

            page.click('.jp-SideBar [data-id="monarch-nb-panel"]')
            panel = page.locator("#monarch-nb-panel")
            mesh = panel.locator('.jp-MonarchNb-mesh[data-mesh="mesh"]')
            mesh.wait_for(**wait)
            assert "2 ranks" in mesh.locator(".jp-MonarchNb-meshHeader").inner_text()
            ranks = mesh.locator("tr.jp-MonarchNb-rank")
            assert ranks.count() == 2
            pids = [int(ranks.nth(i).get_attribute("data-pid") or 0) for i in range(2)]
            # The --no-block cell keeps rank 1 busy while the kernel is idle.
            busy = mesh.locator('tr.jp-MonarchNb-rank[data-rank="1"][data-state="busy"]')
            busy.wait_for(**wait)

            badges = page.locator(".jp-Notebook .jp-MonarchNb-badge")
            assert badges.all_inner_texts() == ["all", "1"]
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "mesh_panel.png"))

            mesh.locator('button[data-action="interrupt"]').click()
            panel.locator("text=interrupted ranks [1]").wait_for(**wait)
            # An interrupt is a stop, not a failure: the rank goes back to idle, unlisted.
            mesh.locator('tr.jp-MonarchNb-rank[data-rank="1"][data-state="idle"]').wait_for(**wait)
            assert "KeyboardInterrupt" not in panel.inner_text()

            # %mesh dashboard --side brings the closed panel back, at that mesh.
            page.click('.jp-SideBar [data-id="monarch-nb-panel"]')
            panel.wait_for(state="hidden", **wait)
            page.locator(".jp-Notebook .jp-Cell").nth(4).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            panel.locator(".jp-MonarchNb-mesh.jp-MonarchNb-revealed").wait_for(**wait)
            page.locator("text=mesh 'mesh' is in the Mesh side panel").wait_for(**wait)
            # The table fits the panel's default width (pid was cut off): pid gives
            # way, and what is shown ends inside the panel.
            assert ranks.nth(1).locator("td.jp-MonarchNb-pid").is_hidden()
            rss = ranks.nth(1).locator("td.jp-MonarchNb-rss")
            # The panel has just been shown, and may redraw the row meanwhile.
            rss_cell = read_until(rss.bounding_box, bool, 90, "the rss cell laid out")
            panel_box = read_until(panel.bounding_box, bool, 90, "the panel laid out")
            assert rss_cell["x"] + rss_cell["width"] <= panel_box["x"] + panel_box["width"]
            assert f"pid {pids[1]}" in (ranks.nth(1).get_attribute("title") or "")
            page.screenshot(path=str(ARTIFACTS / "mesh_panel_side.png"))

            # Restart and stop ask first: no is no.
            mesh.locator('button[data-action="restart"]').click()
            dialog = page.locator(".jp-Dialog")
            dialog.locator("text=Restart mesh 'mesh'?").wait_for(**wait)
            dialog.locator(".jp-mod-reject").click()
            dialog.wait_for(state="detached", **wait)
            assert "restart of 'mesh'" not in panel.inner_text()  # said the moment it is sent
            assert [int(ranks.nth(i).get_attribute("data-pid") or 0) for i in range(2)] == pids

            mesh.locator('button[data-action="stop"]').click()
            dialog.locator("text=Stop mesh 'mesh'?").wait_for(**wait)
            dialog.locator(".jp-mod-accept").click()
            panel.locator(".jp-MonarchNb-empty").wait_for(**wait)
            assert panel.locator(".jp-MonarchNb-mesh").count() == 0
            assert "mesh 'mesh' stopped" in panel.inner_text()
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "mesh_panel_failure.png"))
            dialogs = page.locator(".jp-Dialog").all_inner_texts()
            if dialogs:  # say what got in the way
                raise AssertionError(f"JupyterLab showed a dialog: {dialogs!r}") from None
            raise
        finally:
            browser.close()
    wait_gone(pids)  # no worker survives the panel's stop
