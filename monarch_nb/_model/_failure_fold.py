"""Failures grouped by what failed and where: one traceback for every rank that raised
the same exception type at the same code location, whatever its message.

A failure on every rank usually differs only in a value in its message
(``bad value 3``); printing one traceback per rank repeats the same frames.
The key is the exception type and the traceback's frames (file, line,
function, source); the messages that differ are folded as values are
(``[0] bad value 0``, ``[1-3] bad value 1``) in place of the traceback's last line.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._fold import fold_lines


def failure_key(type_name: str, traceback: str) -> tuple[str, str]:
    """The exception type and the code location: the traceback's frames (its indented
    lines), without the exception's message."""
    frames = "\n".join(line for line in traceback.splitlines() if line.startswith(" "))
    return type_name, frames


def folded_messages(messages: Sequence[tuple[int, str]]) -> list[str]:
    """``[0] bad value 0`` lines, one per distinct message (equal ones share a line)."""
    return fold_lines(messages)


def fold_traceback(traceback: str, type_name: str, messages: Sequence[tuple[int, str]]) -> str:
    """``traceback`` (of the first rank) whose last line, ``ValueError: bad value 0``,
    shows every rank's message folded by rank when they differ:

        ValueError: [0] bad value 0
                    [1] bad value 1
    """
    distinct = {message for _, message in messages}
    if len(distinct) <= 1:
        return traceback
    first = messages[0][1]
    text = traceback.rstrip()
    tail = f": {first}" if first else ""
    if not text.endswith(tail) or (not tail and not text.endswith(type_name)):
        lines = [text, f"--- the message differs by rank ({type_name}):"]
        return "\n".join(lines + folded_messages(messages))
    head = text[: len(text) - len(tail)]
    cut = head.rfind("\n") + 1
    name, head = head[cut:], head[:cut]
    lead = f"{name}: "
    first_line, *rest = folded_messages(messages)
    return head + "\n".join([lead + first_line, *(" " * len(lead) + line for line in rest)])


def differing(messages: Sequence[tuple[int, str]]) -> int:
    """How many distinct messages ``messages`` holds."""
    return len({message for _, message in messages})
