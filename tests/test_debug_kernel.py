"""The pdb bridge in a real kernel: prompts are Jupyter input requests, answered here.

Covers breakpoint() in a %%mesh cell and in an endpoint, pdb commands and the
mesh commands (ranks, cast, continue all), q, post-mortem (%mesh debug), the
kernel's interrupt while paused, a rank dying while paused, and a front end
without stdin (nbval, nbconvert), which must fail the cell, not hang.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from kernel_utils import Kernel
from stdin_kernel import Conversation, converse, scripted

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel(env={"MONARCH_NB_INTERRUPT_GRACE": "1"}) as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --name m")
        yield k


def test_breakpoint_in_a_cell_prompts_per_rank_with_the_cells_source(kernel, tmp_path):
    flag = str(tmp_path / "rank0-paused")
    # Rank 1 pauses only once rank 0, already paused, has created the flag: so the
    # first prompt is rank 0's, and later both ranks are paused at once.
    cell = (
        "%%mesh\nimport os, time\nx = rank * 10\n"
        f"while rank == 1 and not os.path.exists({flag!r}):\n    time.sleep(0.01)\n"
        "breakpoint()\ny = x + 1\ny"
    )
    state = {"step": 0}

    def answer(prompt: str, convo: Conversation) -> str:
        state["step"] += 1
        match state["step"]:
            case 1:
                assert prompt == "(Pdb rank 0) "
                convo.wait_text("-> y = x + 1")  # where it stopped, from the cell's source
                state["mark"] = len(convo.text())
                return "p x"
            case 2:
                assert convo.wait_text("0", start=state["mark"]).strip() == "0"
                return f"!open({flag!r}, 'w').close()"
            case _ if "both" not in state:
                # `ranks` until rank 1 (released by the flag) is listed as paused too.
                text = convo.text()[state.get("listed", 0) :]
                if "rank 1: <mesh-cell-" in text:
                    state["both"] = True
                    state["mark"] = len(convo.text())
                    return "cast 0-1 p rank * 100"
                state["listed"] = len(convo.text())
                return "ranks"
            case _ if "cast" not in state:
                state["cast"] = convo.wait_text("[1] 100", start=state["mark"])
                state["mark"] = len(convo.text())
                return "n"
            case _ if "next" not in state:
                state["next"] = convo.wait_text("(", start=state["mark"])
                return "p y"
            case _:
                assert prompt == "(Pdb rank 0) "
                return "continue all"

    reply, convo = converse(kernel, cell, answer)
    assert reply.status == "ok", convo.text()
    assert set(convo.prompts) == {"(Pdb rank 0) "}  # rank 0 stayed attached
    assert "[0] 0\n" in state["cast"]
    assert "[1] 100\n" in state["cast"]
    text = convo.text()
    assert "rank 0 paused at <mesh-cell-" in text
    assert "* rank 0: <mesh-cell-" in text
    assert "  rank 1: <mesh-cell-" in text
    assert "── rank 0 continued ──" in text
    assert "[0] 1\n[1] 11\n" in text  # the cell's value, after continue all


def test_breakpoint_in_an_endpoint_on_chosen_ranks(kernel):
    kernel.ok(
        "from monarch_nb import Actor, endpoint, current_rank, current_mesh\n"
        "import monarch_nb\n"
        "class Stepper(Actor):\n"
        "    def __init__(self):\n        self.rank = current_rank().rank\n"
        "    @endpoint\n    def step(self, x):\n"
        "        loss = x * (self.rank + 1)\n"
        "        monarch_nb.breakpoint(ranks=[1])\n"
        "        return loss\n"
        "steppers = current_mesh().spawn('steppers', Stepper)"
    )
    reply, convo = converse(
        kernel, "steppers.step.call(5).get().values()", scripted("p loss", "w", "c")
    )
    assert reply.status == "ok", convo.text()
    assert convo.prompts == ["(Pdb rank 1) "] * 3  # rank 0 ran on
    text = convo.text()
    assert "-> return loss" in text
    assert "\n10\n" in text
    assert "[5, 10]" in text


def test_breakpoint_in_an_endpoint_another_actor_called(kernel):
    kernel.ok(
        "from monarch_nb import Actor, endpoint, current_rank, current_mesh\n"
        "import monarch_nb\n"
        "class Inner(Actor):\n"
        "    @endpoint\n    def work(self, x):\n"
        "        inner = x + 1\n"
        "        monarch_nb.breakpoint(ranks=[0])\n"
        "        return inner\n"
        "class Outer(Actor):\n"
        "    def __init__(self, inner):\n        self.inner = inner\n"
        "    @endpoint\n    def step(self, x):\n"
        "        return self.inner.slice(procs=0).work.call_one(x).get()\n"
        "inner = current_mesh().spawn('inner', Inner)\n"
        "outer = current_mesh().spawn('outer', Outer, inner)"
    )
    reply, convo = converse(
        kernel, "outer.slice(procs=1).step.call_one(41).get()", scripted("p inner", "c")
    )
    assert reply.status == "ok", convo.text()
    assert convo.prompts == ["(Pdb rank 0) "] * 2
    text = convo.text()
    assert "-> return inner" in text
    assert "\n42\n" in text


def test_q_ends_the_session_with_bdbquit(kernel):
    reply, convo = converse(kernel, "%%mesh --ranks 1\nbreakpoint()\nz = 1", scripted("q"))
    assert reply.error["ename"] == "CellError", convo.text()
    assert "BdbQuit" in reply.traceback
    assert "rank 1: quit (BdbQuit raised in its code)" in convo.text()
    assert kernel.ok("%%mesh\nrank").text() == "[0] 0\n[1] 1\n"


def test_post_mortem_opens_pdb_at_the_failing_frame(kernel):
    failed = kernel.execute("%%mesh --ranks 1\ndef f(v):\n    z = v * 2\n    return 1 / 0\nf(rank)")
    assert failed.error is not None
    reply, convo = converse(kernel, "%mesh debug", scripted("p z", "ll", "c"))
    assert reply.status == "ok", convo.text()
    assert convo.prompts == ["(Pdb rank 1) "] * 3
    text = convo.text()
    assert "-> return 1 / 0" in text
    assert "\n2\n" in text
    assert "z = v * 2" in text  # ll: the function's real source


def test_interrupt_while_paused_stops_the_ranks_and_the_mesh_stays_usable(kernel):
    def answer(prompt: str, convo: Conversation) -> str:
        kernel.manager.interrupt_kernel()  # instead of answering
        return ""

    reply, convo = converse(kernel, "%%mesh --ranks 0\nbreakpoint()\nz = 1", answer)
    assert reply.error["ename"] == "KeyboardInterrupt", convo.text()
    assert "interrupted on rank(s) 0" in reply.traceback
    assert kernel.ok("%%mesh\nrank").text() == "[0] 0\n[1] 1\n"


def test_without_stdin_a_breakpoint_fails_the_cell_instead_of_hanging(kernel):
    reply, convo = converse(
        kernel, "%%mesh\nbreakpoint()\nz = 1", scripted(), allow_stdin=False, timeout=30
    )
    assert convo.prompts == []
    assert reply.error["ename"] == "CellError"
    assert "DebuggerRefused" in reply.traceback
    assert "cannot answer a debugger prompt" in reply.traceback
    assert kernel.ok("%%mesh\nrank").text() == "[0] 0\n[1] 1\n"


def test_a_rank_that_dies_while_paused_is_reported_and_the_others_stay(kernel):
    flag = os.path.join(tempfile.mkdtemp(), "rank0-paused")
    kernel.ok("%mesh start --procs 2 --name dying")  # its own: this test breaks it
    cell = (
        "%%mesh --mesh dying\nimport os, time\n"
        f"while rank == 1 and not os.path.exists({flag!r}):\n    time.sleep(0.01)\n"
        "breakpoint()\nz = 1"
    )
    state: dict[str, int] = {}

    def answers(prompt: str, convo: Conversation) -> str:
        if "flag" not in state:
            state["flag"] = state["listed"] = len(convo.text())
            return f"!open({flag!r}, 'w').close()"
        if "killed" not in state:
            if "rank 1: <mesh-cell-" not in convo.text()[state["listed"] :]:
                state["listed"] = len(convo.text())
                return "ranks"  # until rank 1 is paused too
            state["killed"] = 1
            return "!os.kill(os.getpid(), 9)"
        return "c"

    reply, convo = converse(kernel, cell, answers)
    text = convo.text()
    assert "rank 0 was killed by signal SIGKILL while paused" in text
    assert "(Pdb rank 1) " in convo.prompts
    assert reply.error["ename"] == "MeshFailure", text
    kernel.ok("%mesh stop --mesh dying")
    assert kernel.ok("%%mesh --mesh m\nrank").text() == "[0] 0\n[1] 1\n"


def test_a_death_before_a_restart_does_not_greet_the_next_breakpoint(kernel):
    kernel.ok("%mesh start --procs 2 --name reborn")
    cell = "%%mesh --mesh reborn --ranks 1\nbreakpoint()\nz = 1"
    reply, convo = converse(kernel, cell, scripted("c"))  # the debugger has met this mesh
    assert reply.status == "ok", convo.text()
    kernel.ok("from monarch_nb import current_mesh\ncurrent_mesh('reborn').procs.kill([1])")
    kernel.ok("%mesh restart --mesh reborn --ranks 1")
    reply, convo = converse(kernel, cell, scripted("c"))
    assert reply.status == "ok", convo.text()
    assert convo.prompts == ["(Pdb rank 1) "]
    assert "killed" not in convo.text()
    kernel.ok("%mesh stop --mesh reborn")


def test_a_cell_waiting_on_calls_receives_their_replies_itself(kernel):
    # The debugger's wait hook (installed by %load_ext) serves prompts; between
    # them, the waiting cell takes its calls' replies itself, as a script does
    # (no hand-off from the I/O thread). A breakpoint still stops the receiving
    # and is served (the tests above).
    kernel.ok(
        "from monarch_nb import Actor, endpoint, current_mesh\n"
        "from monarch_nb._controller._client import Controller\n"
        "class Noop(Actor):\n"
        "    @endpoint\n    def noop(self):\n        return None\n"
        "noops = current_mesh().spawn('noops', Noop)\n"
        "noops.noop.call().get()\n"
        "_stats = Controller.get().stats"
    )
    reply = kernel.ok(
        "_before = _stats.replies_to_callers\n"
        "for _ in range(200):\n"
        "    noops.noop.call().get(timeout=60)\n"
        "print('replies to the cell:', _stats.replies_to_callers - _before)"
    )
    taken = int(reply.stream().split("replies to the cell:")[1])
    assert taken >= 2 * 200 * 2 // 3, reply.stream()  # two ranks reply to each call


def test_every_pause_in_a_session_shows_where_it_paused(kernel):
    # Issue 62 item 11: the second pause of a session (the same rank, a later cell,
    # or again after `c` in the same cell) used to come without its header.
    cell = "%%mesh --ranks 0\nfor step in range(2):\n    breakpoint()\n    z = step"
    for _ in range(2):
        reply, convo = converse(kernel, cell, scripted("p step", "c", "p step", "c"))
        assert reply.status == "ok", convo.text()
        assert convo.prompts == ["(Pdb rank 0) "] * 4
        text = convo.text()
        assert text.count("── rank 0 paused at <mesh-cell-") == 2, text
        assert text.count("── rank 0 continued ──") == 2, text
