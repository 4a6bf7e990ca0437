"""Talking to a kernel's input requests: a cell that prompts, answered line by line.

``converse(kernel, code, answer)`` runs ``code`` with ``allow_stdin=True`` and
calls ``answer(prompt, convo)`` for every input request; ``convo`` sees the
cell's text output so far and can wait for more (output and input requests
travel on different channels, so a prompt may arrive before the text printed
just before it). Every wait has a deadline.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from kernel_utils import _OUTPUT_KINDS, Kernel, Reply, plain


class Conversation:
    def __init__(self, kernel: Kernel, msg_id: str, deadline: float) -> None:
        self.kernel, self.msg_id, self.deadline = kernel, msg_id, deadline
        self.outputs: list[dict[str, Any]] = []
        self.prompts: list[str] = []
        self.idle = False

    def text(self) -> str:
        return Reply("", {}, self.outputs).text()

    def pump(self, timeout: float = 0.05) -> None:
        """Take the iopub messages that arrived (waiting up to ``timeout`` for one)."""
        try:
            msg = self.kernel.client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return
        if msg["parent_header"].get("msg_id") != self.msg_id:
            return
        if msg["msg_type"] == "status":
            self.idle = msg["content"]["execution_state"] == "idle"
        elif msg["msg_type"] in _OUTPUT_KINDS:
            self.outputs.append(msg)

    def wait_text(self, needle: str, *, start: int = 0, timeout: float = 15) -> str:
        """The output from character ``start`` on, once it contains ``needle``."""
        deadline = time.monotonic() + timeout
        while needle not in self.text()[start:]:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in the output: {self.text()[start:]!r}")
            self.pump()
        return self.text()[start:]


def converse(
    kernel: Kernel,
    code: str,
    answer: Callable[[str, Conversation], str],
    *,
    timeout: float = 60,
    allow_stdin: bool = True,
) -> tuple[Reply, Conversation]:
    """Run ``code``; answer each input request with ``answer(prompt, convo)``."""
    client = kernel.client
    msg_id = client.execute(code, store_history=False, allow_stdin=allow_stdin)
    convo = Conversation(kernel, msg_id, time.monotonic() + timeout)
    reply = None
    while not (convo.idle and reply is not None):
        if time.monotonic() > convo.deadline:
            raise TimeoutError(f"cell did not finish in {timeout} s; output: {convo.text()!r}")
        try:
            msg = client.get_stdin_msg(timeout=0.01)
            if msg["msg_type"] == "input_request":
                prompt = msg["content"]["prompt"]
                convo.prompts.append(prompt)
                client.input(answer(prompt, convo))
        except queue.Empty:
            pass
        if reply is None:
            try:
                msg = client.get_shell_msg(timeout=0.01)
                if msg["parent_header"].get("msg_id") == msg_id:
                    reply = msg
            except queue.Empty:
                pass
        convo.pump()
    return Reply(reply["content"]["status"], reply["content"], convo.outputs), convo


def scripted(*lines: str, then: str = "continue all") -> Callable[[str, Conversation], str]:
    """Answer with ``lines`` in order, then ``then`` for every later prompt."""
    queue_ = list(lines)
    return lambda prompt, convo: queue_.pop(0) if queue_ else then


__all__ = ["Conversation", "converse", "plain", "scripted"]
