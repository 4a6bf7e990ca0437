"""magics/_extension.py: %mesh and %%mesh through a real kernel (jupyter_client)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from kernel_utils import Kernel, worker_pids

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 4 --name m")
        yield k


def test_load_ext_is_quick_and_imports_nothing_heavy():
    with Kernel() as k:
        k.ok("import sys, time\nt = time.perf_counter()")
        k.ok("%load_ext monarch_nb")
        reply = k.ok("print(time.perf_counter() - t < 1.0, 'torch' in sys.modules)")
        assert reply.stream() == "True False\n"
        assert k.worker_pids() == []


def test_help_comes_from_the_argument_definitions(kernel):
    line = kernel.ok("%mesh?").content["payload"][0]["data"]["text/plain"]
    assert "%mesh start" in line
    assert "--dist" in line
    assert "%mesh push" in line
    cell = kernel.ok("%%mesh?\n").content["payload"][0]["data"]["text/plain"]
    assert "--ranks" in cell
    assert "--no-block" in cell


def test_status_table(kernel):
    text = kernel.ok("%mesh status").text()
    lines = text.splitlines()
    assert lines[0].startswith("mesh 'm' · running · 4 ranks")
    assert lines[1].split() == ["rank", "host", "pid", "state", "current", "work", "cpu", "rss"]
    assert [line.split()[0] for line in lines[2:6]] == ["0", "1", "2", "3"]
    assert kernel.ok("%mesh").text() == text  # alone: status


def test_cell_value_is_folded_and_stored(kernel):
    reply = kernel.ok("%%mesh\nx = [rank % 2]\n7")
    assert reply.displays()[-1]["data"]["text/plain"] == "[0-3] 7"
    assert (
        kernel.ok("%%mesh --out res\nx").displays()[-1]["data"]["text/plain"]
        == "[0,2] [0]\n[1,3] [1]"
    )
    assert (
        kernel.ok("print(_mesh.values(), res.values())").stream()
        == "[7, 7, 7, 7] [[0], [1], [0], [1]]\n"
    )
    assert kernel.ok("%%mesh\nx = 1").outputs == []  # no trailing expression: nothing shown


def test_rank_selection(kernel):
    text = kernel.ok("%%mesh --ranks 0,2-3 --ordered\nprint(rank)\nrank").text()
    assert text == "[0] 0\n[2] 2\n[3] 3\n[0] 0\n[2] 2\n[3] 3\n"
    assert kernel.ok("%%mesh --where procs=1\nrank").text() == "[1] 1\n"


def test_remote_error_fails_the_cell_with_one_grouped_traceback(kernel):
    reply = kernel.execute("%%mesh\nvalue = 1\nraise ValueError('bad ' + str(rank > 1))")
    assert reply.status == "error"
    text = reply.traceback
    # One exception type at one line: one traceback for every rank, the messages
    # (which differ) folded by rank under it.
    assert text.count("Traceback (most recent call last)") == 1, text
    assert "(rank 0-3)" in text
    assert "ValueError: [0-1] bad False" in text
    assert "[2-3] bad True" in text
    assert "raise ValueError('bad ' + str(rank > 1))" in text  # the cell's source line
    assert reply.error["ename"] == "CellError"
    assert text.startswith("-" * 75 + "\nCellError: %%mesh cell [")


def _colour_before(word: str, raw: str) -> str:
    """The escape code IPython put just before ``word`` in a coloured traceback."""
    found = re.search(rf"(\x1b\[[\d;]*m){word}\b", raw)
    assert found, raw
    return found.group(1)


def test_remote_errors_in_ipython_colours_named_by_the_execution_count(kernel):
    # Other tests' cells do not count (store_history=False): In [1] is taken by them.
    local = kernel.collect(kernel.client.execute("raise KeyError(1)", store_history=True))
    own = _colour_before("KeyError", "\n".join(local.error["traceback"]))
    msg_id = kernel.client.execute("%%mesh\nraise KeyError(rank)", store_history=True)
    reply = kernel.collect(msg_id)
    number = reply.content["execution_count"]
    assert number == local.content["execution_count"] + 1
    raw = "\n".join(reply.error["traceback"])
    # The exception names in the colour this IPython gives its own (8 and 9 differ).
    assert _colour_before("KeyError", raw) == own
    assert _colour_before("CellError", raw) == own
    text = reply.traceback
    # In [N] runs as <mesh-cell-N>, or <mesh-cell-N.2> if an uncounted cell (this
    # module's others, numbered by the process) took that name already.
    name = rf"{number}(\.\d+)?"
    assert re.search(rf"CellError: %%mesh cell \[{name}\] failed on rank\(s\) 0-3", text), text
    assert re.search(rf'File "<mesh-cell-{name}>", line 1, in <module>', text)
    kernel.ok("%colors NoColor")
    try:
        reply = kernel.execute("%%mesh\nraise KeyError(rank)")
        assert "\x1b[" not in "\n".join(reply.error["traceback"])
    finally:
        kernel.ok("%colors Neutral")


def test_syntax_error_is_shown_like_a_local_one(kernel):
    reply = kernel.execute("%%mesh\nok = 1\nbroken = (")
    assert reply.status == "error"
    assert reply.error["ename"] == "SyntaxError"
    text = reply.traceback
    assert "<mesh-cell-" in text
    assert ":2" in text
    assert "broken = (" in text
    assert "_extension.py" not in text
    assert "interactiveshell" not in text


def test_logs_searches_what_ranks_printed(kernel):
    kernel.ok("%%mesh\nprint(f'logged by {rank}')")
    text = kernel.ok("%mesh logs --ranks 2 --grep 'logged by' --since 5m").text()
    assert re.fullmatch(r"\[2\] \S+ \S+ logged by 2\n", text), text
    assert kernel.ok("%mesh logs --grep nothing-like-this").text() == "no log lines matched\n"


def test_push_and_pull(kernel):
    kernel.ok("import math\nlocal = 2")
    kernel.ok("%mesh push scale=local * 3 name='a b' f=math.sqrt")
    assert kernel.ok("%%mesh\nscale, name, f(16)").text() == "[0-3] (6, 'a b', 4.0)\n"
    kernel.ok("%mesh push --ranks 1 scale=-1")
    reply = kernel.ok("vm = %mesh pull scale\nprint(vm.values())")
    assert reply.stream() == "[6, -1, 6, 6]\n"


def test_scatter_gather_and_map(kernel):
    kernel.ok("data = list(range(10))")
    kernel.ok("%mesh scatter shard=data[:6] word='abcd'")
    assert kernel.ok("%%mesh\nshard, word").text() == (
        "[0] ([0, 1], 'a')\n[1] ([2, 3], 'b')\n[2] ([4], 'c')\n[3] ([5], 'd')\n"
    )
    assert kernel.ok("x = %mesh gather shard\nprint(x)").stream() == "[0, 1, 2, 3, 4, 5]\n"
    reply = kernel.ok(
        "import monarch_nb\nprint(monarch_nb.current_mesh().map(lambda x: x + 1, data))"
    )
    assert reply.stream() == "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
    progress = [m["content"] for m in reply.outputs if m["msg_type"] == "update_display_data"]
    assert progress[-1]["data"]["text/plain"] == "map: 10/10 items"
    reply = kernel.execute("%mesh scatter n=3")
    assert reply.content["ename"] == "UsageError"
    assert "splits something with len() and slicing" in reply.content["evalue"]


def test_usage_errors_name_the_bad_value(kernel):
    for line, expected in [
        ("%mesh strat", "unknown %mesh command 'strat'"),
        ("%mesh start --procs 0", "--procs must be at least 1, got 0"),
        ("%mesh status --mesh nope", "no mesh named 'nope'"),
        ("%%mesh --ranks 9\n1", "has ranks 0-3, not 9"),
        ("%%mesh --timeout -1\n1", "--timeout must be a positive number of seconds, got -1.0"),
        ("%%mesh --out 1x\n1", "--out '1x' is not a Python name"),
        ("%mesh push 1", "expected NAME=EXPR"),
    ]:
        reply = kernel.execute(line)
        assert reply.status == "error", line
        assert reply.content["ename"] == "UsageError", line
        assert expected in reply.content["evalue"], (line, reply.content["evalue"])
        assert reply.stream("stderr").startswith("UsageError: ")


def test_mesh_on_runs_plain_cells_on_the_ranks_until_off(kernel):
    assert "plain cells now run on mesh 'm'" in kernel.ok("%mesh on --ranks 0-1").text()
    reply = kernel.ok("print('from', rank)\nrank")
    assert reply.text().startswith("── on mesh 'm'")
    assert "[0] from 0" in reply.text()
    assert "[1] from 1" in reply.text()
    assert reply.displays()[-1]["data"]["text/plain"] == "[0] 0\n[1] 1"
    assert kernel.ok("%mesh status").text().startswith("mesh 'm'")  # magics still run here
    kernel.ok("%mesh off")
    reply = kernel.ok("rank = 'local'\nprint(rank)")
    assert reply.stream() == "local\n"


def test_top_level_await_and_get_on_actors(kernel):
    reply = kernel.ok(
        "from monarch_nb import Actor, endpoint\n"
        "from monarch_nb.magics import current_mesh\n"
        "class Echo(Actor):\n"
        "    @endpoint\n"
        "    def echo(self, x):\n"
        "        return x\n"
        "echoes = current_mesh().spawn('echo', Echo)\n"
        "awaited = await echoes.echo.call(5)\n"
        "print(awaited.values(), echoes.echo.call(6).get(timeout=30).values())"
    )
    assert reply.stream() == "[5, 5, 5, 5] [6, 6, 6, 6]\n"


def test_several_named_meshes(kernel):
    kernel.ok("%mesh start --procs 1 --name small")
    try:
        assert kernel.ok("%%mesh\nworld_size").text() == "[0] 1\n"  # last started is default
        assert kernel.ok("%%mesh --mesh m\nworld_size").text() == "[0-3] 4\n"
    finally:
        kernel.ok("%mesh stop --mesh small")
    assert kernel.ok("%%mesh\nworld_size").text() == "[0-3] 4\n"


def test_dist_gloo_all_reduce():
    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --dist gloo")
        reply = k.ok("%%mesh\nx = torch.full((2,), float(rank))\ndist.all_reduce(x)\nx")
        assert reply.text() == "[0-1] tensor([1., 1.])\n"


def test_unload_stops_every_mesh():
    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --name a")
        k.ok("%mesh start --procs 1 --name b")
        assert len(k.worker_pids()) == 3
        k.ok("%unload_ext monarch_nb")
        assert k.worker_pids() == []
        assert k.execute("%mesh status").status == "error"


@pytest.mark.parametrize("how", ["shutdown", "restart"])
def test_kernel_shutdown_and_restart_leave_no_workers(how):
    k = Kernel()
    try:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2")
        pids = k.worker_pids()
        assert len(pids) == 2
        if how == "restart":
            k.manager.restart_kernel(now=False)
            from kernel_utils import wait_gone

            wait_gone(pids)
            assert not set(worker_pids()) & set(pids)
    finally:
        k.shutdown()
    assert not set(worker_pids()) & set(pids)


def test_plain_terminal_ipython_shows_text(tmp_path):
    # The same magics in terminal IPython (no kernel, no widgets): text only.
    import subprocess
    import sys

    script = tmp_path / "session.ipy"
    script.write_text(
        "%load_ext monarch_nb\n"
        "%mesh start --procs 2\n"
        "get_ipython().run_cell(\"%%mesh\\nprint('hi from', rank)\\nrank * 10\")\n"
        'get_ipython().run_cell("%%mesh\\n1 / (rank - 1)")\n'
        "%mesh stop\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "IPython", "--colors=NoColor", str(script)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    text = out.stdout + out.stderr
    assert "[0] hi from 0" in text
    assert "[1] hi from 1" in text
    assert "[0] 0\n[1] 10" in text
    assert re.search(r"CellError: %%mesh cell \[[\d.]+\] failed on rank\(s\) 1", text)
    assert "    1 / (rank - 1)" in text  # the cell's own source line, from the rank
    assert "mesh 'mesh' stopped" in text


def test_too_many_ranks_per_cpu_say_how_to_mean_it(kernel):
    before = sorted(kernel.worker_pids())
    reply = kernel.execute("%mesh start --procs 100000 --name toomany")
    assert reply.status == "error"
    assert "starts 100000 processes per host, more than 64 per CPU" in reply.text()
    assert "%mesh start --force" in reply.text()
    assert sorted(kernel.worker_pids()) == before  # nothing was started
    assert "--force" in kernel.ok("%mesh?").content["payload"][0]["data"]["text/plain"]
