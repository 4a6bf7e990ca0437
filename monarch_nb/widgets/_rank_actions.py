"""What a person can do to one rank, from the dashboard or the Mesh panel.

As Ray's dashboard offers per worker: restart the rank (a fresh process for
it alone, ``mesh.restart(ranks=[r])``: the other ranks keep their
namespaces and actors), read its log, debug it, and ask why it hangs
(``%mesh why``). :func:`rank_action` does one and says what happened, as
text; the dashboard's bar (:class:`RankActions`) and the panel
(``magics/_panel.py``) only show it.

``debug`` cannot open pdb from a button: a prompt needs a running cell to
answer it in. It shows the rank's stack now and names the cell magic that
opens the post-mortem (``%mesh debug --rank R``); the panel inserts that
cell below the active one, ready to run.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._controller._events import RankState
from .._model._errors import MonarchNbError, format_ranks

RANK_ACTIONS = ("restart", "logs", "debug", "why")
TIPS = {
    "restart": "a fresh process for this rank alone (its variables and actors are lost; "
    "the other ranks keep theirs)",
    "logs": "the last lines this rank wrote to its log",
    "debug": "its stack now, and the cell that opens pdb where its last call raised",
    "why": "%mesh why: which ranks wait in which collective, and where the others are",
    "dismiss": "hide this rank's 'slow' mark until it straggles on a later call",
}
LOG_LINES = 30
_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action did: one line, and the text behind it (a log, a stack)."""

    action: str
    rank: int
    ok: bool
    message: str
    detail: str = ""
    command: str = ""  # a cell to run for what a button cannot do ("%mesh debug --rank 1")


def _rank_status(mesh: Any, rank: int) -> Any:
    for status in mesh.status().status.ranks:
        if status.rank == rank:
            return status
    return None


def rank_action(mesh: Any, action: str, rank: int) -> ActionResult:
    """Do ``action`` (one of RANK_ACTIONS) to ``rank`` of the notebook mesh ``mesh``."""
    ranks = tuple(mesh.procs.shape.ranks)
    if action not in RANK_ACTIONS:
        return ActionResult(
            action, rank, False, f"unknown action {action!r}; use one of {RANK_ACTIONS}"
        )
    if rank not in ranks:
        return ActionResult(
            action,
            rank,
            False,
            f"rank {rank} is not in mesh {mesh.name!r} (ranks {format_ranks(ranks)})",
        )
    try:
        return _ACTIONS[action](mesh, rank)
    except MonarchNbError as exc:
        return ActionResult(action, rank, False, f"{action} of rank {rank}: {exc}")


def _restart(mesh: Any, rank: int) -> ActionResult:
    record = mesh.restart(ranks=[rank])
    status = _rank_status(mesh, rank)
    pid = f" (pid {status.pid})" if status is not None else ""
    message = (
        f"rank {rank} restarted in {record.seconds:.1f} s: a fresh process{pid}; "
        "the other ranks kept theirs"
    )
    if record.respawned:
        message += f"; actors spawned again there: {', '.join(record.respawned)}"
    if record.to_spawn_again:
        message += f"; spawn these again yourself: {', '.join(record.to_spawn_again)}"
    return ActionResult("restart", rank, True, message)


def _logs(mesh: Any, rank: int) -> ActionResult:
    lines = mesh.procs.logs(ranks=[rank], tail=LOG_LINES)
    detail = "\n".join(str(line) for line in lines) or "(nothing written yet)"
    return ActionResult(
        "logs", rank, True, f"the last {len(lines)} lines of rank {rank}'s log", detail
    )


def _debug(mesh: Any, rank: int) -> ActionResult:
    status = _rank_status(mesh, rank)
    command = f"%mesh debug --rank {rank} --mesh {mesh.name}"
    if status is not None and status.state is RankState.PAUSED:
        return ActionResult(
            "debug",
            rank,
            True,
            f"rank {rank} is paused in pdb: answer its prompt in the cell that waits for it",
        )
    if status is not None and status.state is RankState.DEAD:
        return ActionResult(
            "debug",
            rank,
            False,
            f"rank {rank}'s process is dead (returncode {status.returncode}): nothing to debug; "
            "restart it, and read its log for what it wrote last",
        )
    stacks = mesh.procs.stacks(timeout=_TIMEOUT_S)
    stack = stacks.get(rank, "(no answer)")
    if status is not None and status.state is RankState.FAILED:
        message = f"rank {rank}'s last call raised: run `{command}` for pdb where it raised"
    else:
        message = (
            f"rank {rank}'s stack now; `{command}` opens pdb where its last call raised, "
            "breakpoint() in a cell pauses it there"
        )
    return ActionResult("debug", rank, True, message, stack, command)


def _why(mesh: Any, rank: int) -> ActionResult:
    diagnosis = mesh.procs.diagnose(timeout=_TIMEOUT_S)
    return ActionResult("why", rank, True, f"%mesh why (asked from rank {rank})", str(diagnosis))


_ACTIONS: dict[str, Callable[[Any, int], ActionResult]] = {
    "restart": _restart,
    "logs": _logs,
    "debug": _debug,
    "why": _why,
}


def result_html(result: ActionResult) -> str:
    colour = "inherit" if result.ok else "var(--jp-error-color1,#b71c1c)"
    body = (
        f'<div class="mnb-action-result" data-action="{result.action}" data-rank="{result.rank}" '
        f'data-ok="{str(result.ok).lower()}" style="color:{colour}">'
        f"<small>{html.escape(result.message)}</small>"
    )
    if result.detail:
        body += (
            "<pre style='max-height:16em;overflow:auto;font-size:11px;margin:0'>"
            f"{html.escape(result.detail)}</pre>"
        )
    return body + "</div>"


class RankActions:
    """The dashboard's per-rank bar: a rank, and restart / logs / debug / why / dismiss.

    ``restart`` asks once more before it kills anything (the button reads
    "confirm restart of rank 1"). ``dismiss`` hides the rank's straggler mark.
    """

    def __init__(
        self,
        ranks: Sequence[int],
        act: Callable[[str, int], ActionResult],
        dismiss: Callable[[int], str],
    ) -> None:
        import ipywidgets as w

        self._act, self._dismiss = act, dismiss
        self._armed: int | None = None  # the rank a first restart click is for
        self.picker = w.Dropdown(
            options=[(f"rank {r}", r) for r in ranks],
            description="rank",
            style={"description_width": "initial"},
            layout=w.Layout(width="auto"),
        )
        self.buttons = {}
        for name in (*RANK_ACTIONS, "dismiss"):
            label = "dismiss slow mark" if name == "dismiss" else name
            button = w.Button(description=label, tooltip=TIPS[name], layout=w.Layout(width="auto"))
            button.add_class(f"mnb-action-{name}")
            button.on_click(lambda _, name=name: self.run(name))
            self.buttons[name] = button
        self.picker.observe(lambda _: self._disarm(), names="value")
        self.output = w.HTML()
        self.widget = w.VBox([w.HBox([self.picker, *self.buttons.values()]), self.output])
        self.widget.add_class("mnb-rank-actions")

    def set_ranks(self, ranks: Sequence[int]) -> None:
        value = self.picker.value
        self.picker.options = [(f"rank {r}", r) for r in ranks]
        if value in ranks:
            self.picker.value = value

    def pick(self, rank: int) -> None:
        self.picker.value = rank

    def offer(self, rank: int, note: str, detail: str = "") -> None:
        """Pick ``rank`` and show ``note`` (and ``detail``) under the bar, unasked: a
        hang the dashboard found, with the diagnosis it read. Shown at once because a
        button cannot answer while a cell holds the kernel, which a hang usually
        does. A restart waiting for its second click is left as it is."""
        if self._armed is not None:
            return
        self.pick(rank)
        self.output.value = result_html(ActionResult("offer", rank, True, note, detail))

    def _disarm(self) -> None:
        self._armed = None
        self.buttons["restart"].description = "restart"

    def run(self, action: str, rank: int | None = None, *, confirmed: bool = False) -> str:
        """Do ``action`` to ``rank`` (default: the picked one); the HTML shown.
        A restart needs a second call (or ``confirmed``)."""
        if rank is not None:
            self.pick(rank)
        rank = self.picker.value
        if rank is None:
            return self.output.value
        if action == "dismiss":
            self._disarm()
            message = self._dismiss(rank)
            self.output.value = result_html(ActionResult("dismiss", rank, True, message))
            return self.output.value
        if action == "restart" and not confirmed and self._armed != rank:
            self._armed = rank
            self.buttons["restart"].description = f"confirm restart of rank {rank}"
            self.output.value = (
                '<div class="mnb-action-result" data-action="restart-armed">'
                f"<small>click again to replace rank {rank}'s process: its variables and "
                "actors are lost; the other ranks keep theirs</small></div>"
            )
            return self.output.value
        self._disarm()
        if action == "restart":
            self.output.value = f"<small>restarting rank {rank}...</small>"
        self.output.value = result_html(self._act(action, rank))
        return self.output.value

    def close(self) -> None:
        for button in self.buttons.values():
            button.close()
        self.picker.close()
        self.output.close()
        self.widget.close()
