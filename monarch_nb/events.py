"""What happens on a mesh, as typed events: subscribe with ``procs.events.subscribe(fn)``.

See :mod:`monarch_nb._controller._events` for the list and for the thread
observers run on. ``EventLog`` records events and waits for one (tests, scripts).
"""

from ._controller._events import (
    CallFinished,
    CallStarted,
    CommMessage,
    DisplayData,
    Event,
    EventLog,
    EventStream,
    Heartbeat,
    MeshFailed,
    Output,
    RankFailed,
    RanksRestarted,
    RankState,
    RankStateChanged,
    Subscription,
    print_output,
)
from ._model._public import rename
from ._wire._messages import ResourceSample

__all__ = [
    "CallFinished",
    "CallStarted",
    "CommMessage",
    "DisplayData",
    "Event",
    "EventLog",
    "EventStream",
    "Heartbeat",
    "MeshFailed",
    "Output",
    "RankFailed",
    "RankState",
    "RankStateChanged",
    "RanksRestarted",
    "ResourceSample",
    "Subscription",
    "print_output",
]

rename(globals(), __all__, __name__)  # reprs and tracebacks read monarch_nb.events.X
