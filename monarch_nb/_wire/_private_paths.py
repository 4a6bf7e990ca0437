"""One check for a path whose contents act as you: it must be yours, and nobody else's
to write. A job's state file starts and stops processes; a workspace goes on every
rank's PYTHONPATH. Another user who owns or can write such a path could do either."""

from __future__ import annotations

import os
import stat


def refuse_unless_private(
    info: os.stat_result, subject: str, path: str, *, harm: str, remedy: str, yours: str
) -> None:
    """Raise PermissionError unless ``info`` (of ``path``) is this user's and neither
    group nor others may write it. The message names ``subject`` and ``path``, says
    what another user could then do (``harm``), and how to fix it: ``remedy`` for
    another user's path, ``chmod go-w`` if ``yours`` (a condition) holds."""
    me = os.geteuid()
    if info.st_uid != me:
        raise PermissionError(
            f"{subject} {path!r} belongs to uid {info.st_uid}, not to you (uid {me}): "
            f"its owner could {harm}. {remedy}"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"{subject} {path!r} is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):o}): they could {harm}. "
            f"If {yours}, run: chmod go-w {path}"
        )
