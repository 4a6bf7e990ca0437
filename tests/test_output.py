"""Worker stdout/stderr reaches the controller live, line by line, by rank."""

import threading
import time

from monarch_nb import Actor, endpoint
from monarch_nb.events import Output


class Talker(Actor):
    @endpoint
    def talk(self, gate: float) -> None:
        import os
        import sys
        import time

        print("first line")
        time.sleep(gate)  # the controller must see "first line" before we return
        sys.stderr.write("to stderr\n")
        os.write(1, b"from C-level fd 1\n")
        print("partial", end="")
        print(" line")


def test_output_streams_live_with_rank_and_stream(procs4):
    lines: list = []
    first_seen = threading.Event()

    call_done_at_first_line: list[bool] = []
    calls: list = []  # the call's future, once call() has returned it

    def handler(out):
        lines.append(out)
        if out.line == "first line" and not first_seen.is_set():
            call_done_at_first_line.append(bool(calls) and calls[0].done())
            first_seen.set()

    talkers = procs4.slice(procs=[1, 2]).spawn("talk", Talker)
    with procs4.events.subscribe(handler, kinds=(Output,)):
        calls.append(talkers.talk.call(1.0))
        fut = calls[0]
        assert first_seen.wait(60)
        assert call_done_at_first_line == [False], "output arrived only at the end of the call"
        fut.get(timeout=60)
        deadline = time.monotonic() + 30  # an event, not a delay: under load it comes late
        while len(lines) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
    by_rank = {r: [(o.stream, o.line) for o in lines if o.rank == r] for r in (1, 2)}
    for rank in (1, 2):
        assert ("stdout", "first line") in by_rank[rank]
        assert ("stderr", "to stderr") in by_rank[rank]
        assert ("stdout", "from C-level fd 1") in by_rank[rank]
        assert ("stdout", "partial line") in by_rank[rank]


def test_default_handler_prefixes_lines_with_the_rank(procs4, capfd):
    talkers = procs4.slice(procs=3).spawn("talk_default", Talker)
    talkers.talk.call_one(0.0).get(timeout=10)
    deadline = time.monotonic() + 30  # an event, not a delay: under load it comes late
    out = ""
    while "[3] partial line" not in out and time.monotonic() < deadline:
        time.sleep(0.02)
        out += capfd.readouterr().out
    assert "[3] first line" in out
    assert "[3] partial line" in out


class Progress(Actor):
    @endpoint
    def bar(self) -> None:
        import sys

        for i in range(3):
            sys.stdout.write(f"\r{i}/3")
            sys.stdout.flush()
        sys.stdout.write("\rdone\n")


def test_progress_updates_arrive_as_carriage_return_segments(procs4):
    lines: list = []
    bars = procs4.slice(procs=0).spawn("bars", Progress)
    with procs4.events.subscribe(lines.append, kinds=(Output,)):
        bars.bar.call_one().get(timeout=10)
        deadline = time.monotonic() + 30  # an event, not a delay: under load it comes late
        while not any(o.line == "done" for o in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert lines[-1].line == "done"
    assert lines[-1].end == "\n"
    assert all(o.end == "\r" for o in lines[:-1])
    assert {o.line for o in lines[:-1]} <= {"0/3", "1/3", "2/3"}


def test_output_tail_keeps_each_ranks_last_lines(procs4):
    talkers = procs4.slice(procs=2).spawn("talk_tail", Talker)
    earlier = len(procs4.output_tail(2))  # rank 2 also talked in an earlier test
    talkers.talk.call_one(0.0).get(timeout=10)
    deadline = time.monotonic() + 30  # an event, not a delay: under load it comes late
    while time.monotonic() < deadline:
        tail = [o.line for o in procs4.output_tail(2)][earlier:]
        if "partial line" in tail and "to stderr" in tail:  # two pipes: wait for both
            break
        time.sleep(0.01)
    # Two pipes: lines keep their order within a stream, not across stdout and stderr.
    assert [line for line in tail if line != "to stderr"][-3:] == [
        "first line",
        "from C-level fd 1",
        "partial line",
    ]
    assert "to stderr" in tail
    assert all(o.rank == 2 for o in procs4.output_tail(2))
