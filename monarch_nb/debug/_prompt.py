"""The ``(Pdb rank N)`` prompt, run on the thread that waits for a call.

That thread is the one that may read input: in a kernel it is the main
thread, whose ``input()`` is Jupyter's input request; in a script it is the
terminal. Where there is no stdin (nbval, nbconvert: ipykernel raises
StdinNotImplementedError; a script without a terminal: EOFError) the paused
ranks are told to raise, so the cell fails with a clear error instead of
hanging.

A kernel interrupt (KeyboardInterrupt in ``input()`` or in a wait) is not
handled here: it propagates to ``CallFuture.get``, which interrupts the
call's ranks, and pdb on each rank stops with KeyboardInterrupt.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from .._model._errors import format_ranks
from .._model._future import pumps_here
from . import _commands as cmd
from ._session import DebugSession, session_for

NO_STDIN = (
    "breakpoint() paused rank(s) {ranks}, but this front end cannot answer a debugger "
    "prompt ({why}); remove the breakpoint, or run the cell in an interactive notebook "
    "or a script on a terminal"
)


class NoStdin(Exception):
    """The controller has no way to read a line from its user."""


def read_line(prompt: str) -> str:
    """One line from the user (Jupyter's input request in a kernel)."""
    try:
        return input(prompt)
    except EOFError:
        raise NoStdin("stdin is closed") from None
    except Exception as exc:
        if type(exc).__name__ == "StdinNotImplementedError":  # ipykernel, allow_stdin False
            raise NoStdin("the kernel's client does not allow input requests") from None
        raise


def wait_hook(future: Any, deadline: float | None) -> None:
    """For ``CallFuture.get``: wait for ``future``, serving prompts of its group's ranks."""
    call = future._call
    group = call.group if call is not None else None
    if group is None:
        return
    session = session_for(group)
    future.add_done_callback(lambda _: session.wake())
    prompt = Prompt(session)
    # Where the controller lets a waiting caller receive its replies itself (see
    # Controller.receive_until_done), do so between prompts: a rank that pauses
    # makes the receiving stop (the session's change wakes it), and is served.
    tracker = call.tracker if call is not None else None
    receive = getattr(tracker, "receive_until_done", None)
    wake_receiver = getattr(tracker, "wake_receiver", None)
    while True:
        if receive is not None and wake_receiver is not None and not pumps_here():
            with session.changed:
                session.wakers.append(wake_receiver)
            try:
                receive(future, deadline, lambda: bool(session.paused))
            finally:
                with session.changed:
                    session.wakers.remove(wake_receiver)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not session.wait(lambda: future.done() or bool(session.paused), timeout):
            return  # the deadline passed: CallFuture.get raises its timeout
        if not session.paused:
            return
        prompt.serve()


class Prompt:
    """Serves the paused ranks of one session until none is paused."""

    def __init__(
        self,
        session: DebugSession,
        read: Callable[[str], str] = read_line,
        write: Callable[[str], None] | None = None,
    ) -> None:
        self.session = session
        self._read = read
        self._write = write or _print
        self._no_stdin: str | None = None
        # rank -> the serial of its pause the user was told of (see Pause.serial)
        self._announced: dict[int, int] = {}

    def serve(self) -> None:
        session = self.session
        while True:
            self._report_news()
            paused = session.snapshot()
            if not paused:
                return
            if self._no_stdin is not None:
                ranks = tuple(sorted(paused))
                why = NO_STDIN.format(ranks=format_ranks(ranks), why=self._no_stdin)
                session.refuse(ranks, why)
                continue
            attached = session.attached
            if attached not in paused:
                self._attach(min(paused), paused)
            elif self._announced.get(attached) != paused[attached].serial:
                self._attach(attached, paused)  # paused anew (a later cell, or after `c`)
            news = [r for r in paused if self._announced.get(r) != paused[r].serial]
            for other in sorted(set(news) - {session.attached}):
                self._announced[other] = paused[other].serial
                self._write(f"── rank {other} paused too, at {paused[other].location} ──\n")
                self._show(session.take_output(other))
            rank = session.attached
            assert rank is not None
            self._show(session.take_output(rank))
            try:
                line = self._read(paused[rank].prompt)
            except NoStdin as exc:
                self._no_stdin = str(exc)
                continue
            try:
                command = cmd.parse(line, len(session.group.shape))
            except cmd.CommandError as exc:
                self._write(f"*** {exc}\n")
                continue
            # While the line was typed the rank may have left that pause (the
            # script's Ctrl-C, a death, or a later breakpoint): never send it on.
            was, paused = paused[rank], session.snapshot()
            now = paused.get(rank)
            if isinstance(command, cmd.PdbLine) and (now is None or now.serial != was.serial):
                self._write(f"*** rank {rank} is no longer paused there; not sent: {line}\n")
                continue
            self._run(command, rank, paused)

    def _run(self, command: cmd.Command, rank: int, paused: dict[int, Any]) -> None:
        session = self.session
        match command:
            case cmd.Help():
                self._write(cmd.HELP)
            case cmd.Ranks():
                self._write(self._ranks_table(paused))
            case cmd.Attach(target):
                if target not in paused:
                    self._write(f"*** rank {target} is not paused; paused: {_listing(paused)}\n")
                else:
                    self._attach(target, paused)
            case cmd.ContinueAll():
                ranks = tuple(sorted(paused))
                for r in ranks:
                    session.send(r, "c")
                session.wait_answer(ranks)
                self._collect(ranks)
            case cmd.Cast(targets, line):
                wanted = tuple(sorted(paused)) if targets is None else targets
                missing = [r for r in wanted if r not in paused]
                if missing:
                    self._write(f"*** not paused: rank(s) {format_ranks(missing)}\n")
                ranks = tuple(r for r in wanted if r in paused)
                for r in ranks:
                    session.send(r, line)
                session.wait_answer(ranks)
                self._collect(ranks)
            case cmd.PdbLine(line):
                session.send(rank, line)
                session.wait_answer((rank,))
                self._show(session.take_output(rank))

    def _attach(self, rank: int, paused: dict[int, Any]) -> None:
        self.session.attached = rank
        self._announced[rank] = paused[rank].serial
        others = sorted(r for r in paused if r != rank)
        also = f"; also paused: {format_ranks(others)} (`ranks`, `attach R`)" if others else ""
        self._write(f"── rank {rank} paused at {paused[rank].location}{also} ──\n")

    def _collect(self, ranks: tuple[int, ...]) -> None:
        """Each rank's output, identical ones shown once under their rank set."""
        groups: dict[str, list[int]] = {}
        for r in ranks:
            groups.setdefault(self.session.take_output(r), []).append(r)
        for text, members in groups.items():
            if text.strip():
                body = text.rstrip().replace("\n", "\n    ")
                self._write(f"[{format_ranks(members)}] {body}\n")

    def _report_news(self) -> None:
        session = self.session
        with session.changed:
            ended, session.ended = session.ended, {}
            died, session.died = session.died, {}
        for rank, how in sorted(ended.items()):
            if how == "quit":
                self._write(f"── rank {rank}: quit (BdbQuit raised in its code) ──\n")
            elif how == "continued":
                self._write(f"── rank {rank} continued ──\n")
            elif how == "interrupted":
                self._write(f"── rank {rank} interrupted ──\n")
        for rank, how in sorted(died.items()):
            self._write(f"── rank {rank} {how} while paused; the others stay paused ──\n")

    def _ranks_table(self, paused: dict[int, Any]) -> str:
        lines = []
        for r in sorted(paused):
            mark = "*" if r == self.session.attached else " "
            lines.append(f"{mark} rank {r}: {paused[r].location}")
        return "\n".join(lines) + "\n"

    def _show(self, text: str) -> None:
        if text:
            self._write(text if text.endswith("\n") else text + "\n")


def _listing(paused: dict[int, Any]) -> str:
    return format_ranks(paused) if paused else "none"


def _print(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
