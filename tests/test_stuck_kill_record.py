"""A rank killed after an interrupt's grace is on record once, as monarch_nb's kill,
even when its replacement starts at once (issue 62 item 3).

The notebook replaces such ranks as soon as the stop returns. The I/O thread sets
a dead rank's exit code first and reports the death after draining its output; a
restart begun in between took that report for the replaced process's and dropped
it, so the dashboard never listed the rank (seen in CI under load). Here that
gap is held open: the controller's own exit handler is made to start a second
late, as a loaded machine makes it, and nothing else is changed.
"""

from __future__ import annotations

import time

import pytest

from monarch_nb import this_host
from monarch_nb._controller._events import RankFailed
from monarch_nb._controller._interrupt import wait_for
from monarch_nb._controller._liveness import Liveness
from monarch_nb._model._errors import StuckRanksKilled

pytestmark = pytest.mark.timeout(120)

# Rank 1 blocks the interrupt's SIGINT and sleeps: stuck, as in C or a collective.
STUCK = (
    "import signal, time\n"
    "if rank == 1:\n"
    "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
    "    time.sleep(60)\n"
)
KILLED = "was killed by monarch_nb: it did not stop within 0.5 s of the interrupt"


def test_a_killed_rank_replaced_at_once_is_on_record_once(monkeypatch: pytest.MonkeyPatch) -> None:
    on_time = Liveness.worker_exited

    def late(self: Liveness, worker: object) -> None:
        time.sleep(1.0)  # the I/O thread still draining the rank's output
        on_time(self, worker)  # type: ignore[arg-type]

    monkeypatch.setattr(Liveness, "worker_exited", late)
    with this_host().spawn_procs(per_host={"procs": 2}, echo_output=False) as procs:
        seen: list[RankFailed] = []
        subscription = procs.events.subscribe(seen.append, kinds=(RankFailed,))
        with pytest.raises(StuckRanksKilled) as stuck:
            wait_for(procs.exec(STUCK), timeout=0.5, grace=0.5)
        assert list(stuck.value.ranks) == [1]
        procs.restart(ranks=[1])  # what the notebook does at once (magics/_replace)
        assert procs.run("rank").values() == [0, 1]  # usable, and the loop has moved on
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        subscription.close()
    assert [(e.rank, e.cause) for e in seen] == [(1, KILLED)]
