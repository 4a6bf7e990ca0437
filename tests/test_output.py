"""Worker stdout/stderr reaches the controller live, line by line, by rank."""

import threading
import time

from monarch_nb import Actor, endpoint, set_output_handler


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

    def handler(out):
        lines.append(out)
        if out.line == "first line":
            first_seen.set()

    talkers = procs4.slice(procs=[1, 2]).spawn("talk", Talker)
    previous = set_output_handler(handler)
    try:
        fut = talkers.talk.call(1.0)
        assert first_seen.wait(5), "output arrived only at the end of the call"
        assert not fut.done()
        fut.get(timeout=10)
        deadline = time.monotonic() + 5
        while len(lines) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        set_output_handler(previous)
    by_rank = {r: [(o.stream, o.line) for o in lines if o.rank == r] for r in (1, 2)}
    for rank in (1, 2):
        assert ("stdout", "first line") in by_rank[rank]
        assert ("stderr", "to stderr") in by_rank[rank]
        assert ("stdout", "from C-level fd 1") in by_rank[rank]
        assert ("stdout", "partial line") in by_rank[rank]


def test_default_handler_prefixes_lines_with_the_rank(procs4, capfd):
    talkers = procs4.slice(procs=3).spawn("talk_default", Talker)
    talkers.talk.call_one(0.0).get(timeout=10)
    deadline = time.monotonic() + 5
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
    previous = set_output_handler(lines.append)
    try:
        bars.bar.call_one().get(timeout=10)
        deadline = time.monotonic() + 5
        while not any(o.line == "done" for o in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        set_output_handler(previous)
    assert lines[-1].line == "done"
    assert lines[-1].end == "\n"
    assert all(o.end == "\r" for o in lines[:-1])
    assert {o.line for o in lines[:-1]} <= {"0/3", "1/3", "2/3"}
