"""Restart policies: how many times a process mesh brings dead ranks back by itself.

::

    procs = this_host().spawn_procs(
        per_host={"procs": 4},
        restart=RestartPolicy(max_restarts=3, window_s=60, ranks="failed"),
    )

When a rank dies, the calls waiting on it fail as always (fail fast); then,
if the policy still allows a restart, the mesh replaces the dead processes
(``ranks="failed"``, the survivors keep their state and actors) or every
process (``ranks="all"``) on a thread of its own, and reports it as a
:class:`~monarch_nb.events.RanksRestarted` event and in ``status()``. A death
past ``max_restarts`` within ``window_s`` seconds fails the whole mesh, as a
mesh without a policy would be after ``restart()`` is not called.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from .._model._errors import MeshUsageError
from .._model._public import publish


@dataclass(frozen=True)
class RestartPolicy:
    """Restart dead ranks automatically, at most ``max_restarts`` times in ``window_s`` s.

    ``ranks="failed"`` replaces only the dead processes (their actors are
    spawned again with the arguments they were first given; the other ranks
    keep their namespaces and actors); ``ranks="all"`` replaces every process,
    as ``procs.restart()`` does (namespaces start empty and actor meshes must
    be spawned again: the event says which).
    """

    max_restarts: int = 3
    window_s: float = 60.0
    ranks: Literal["failed", "all"] = "failed"

    def __post_init__(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise MeshUsageError(
                f"RestartPolicy(max_restarts={self.max_restarts!r}): give an int >= 0"
            )
        if not isinstance(self.window_s, int | float) or self.window_s <= 0:
            raise MeshUsageError(f"RestartPolicy(window_s={self.window_s!r}): give seconds > 0")
        if self.ranks not in ("failed", "all"):
            raise MeshUsageError(f'RestartPolicy(ranks={self.ranks!r}): give "failed" or "all"')


class RestartBudget:
    """The restarts a policy made within its window (I/O thread)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: deque[float] = deque()

    def used(self) -> int:
        """Restarts made within the last ``window_s`` seconds."""
        horizon = time.monotonic() - self.policy.window_s
        while self._times and self._times[0] < horizon:
            self._times.popleft()
        return len(self._times)

    def take(self) -> bool:
        """Count one more restart if the policy allows it now; False if it does not."""
        if self.used() >= self.policy.max_restarts:
            return False
        self._times.append(time.monotonic())
        return True

    def describe(self) -> str:
        policy = self.policy
        return (
            f"its RestartPolicy allows {policy.max_restarts} restart(s) within "
            f"{policy.window_s:g} s and {self.used()} were made"
        )


publish(globals())
