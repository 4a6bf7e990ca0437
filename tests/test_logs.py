"""Rank log files (monarch_nb._services._logs, _worker._log_file) and logging_option
(_controller._log_stream): lines that outlive their rank, searched from here."""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import stat
import uuid

import pytest
from polling import wait_until

from monarch_nb import LogLine, MeshUsageError, this_host
from monarch_nb._controller._log_stream import OutputPrinter
from monarch_nb._services import _logs
from monarch_nb.events import EventLog, Output

pytestmark = pytest.mark.timeout(180)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _output_count(log: EventLog, text: str) -> int:
    return sum(1 for e in log.of(Output) if e.line == text)


def _wait_for_lines(log: EventLog, text: str, count: int, timeout: float = 60.0) -> None:
    log.wait_for(Output, lambda _: _output_count(log, text) >= count, timeout=timeout)


# -- files written by real ranks ----------------------------------------------------------


def test_a_sigkilled_ranks_lines_are_searchable_after_restart():
    name = _unique("killed")
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name, echo_output=False)
    try:
        procs.exec(
            "import logging, sys\n"
            "print(f'step 1 loss {rank + 0.5}')\n"
            "print('to stderr', file=sys.stderr)\n"
            "logging.getLogger('train').warning('loss went up on %d', rank)\n"
        ).get(timeout=60)
        procs.kill([1])
        procs.restart()
        procs.exec("print(f'step 2 loss {rank + 0.25}')").get(timeout=60)

        lines = procs.logs(ranks=[1], grep="loss")
        assert [(line.rank, line.stream, line.text) for line in lines] == [
            (1, "stdout", "step 1 loss 1.5"),
            (1, "WARNING", "loss went up on 1"),
            (1, "stdout", "step 2 loss 1.25"),
        ]
        assert lines[0].time <= lines[-1].time
        assert str(lines[1]).startswith("[1] ")
        assert str(lines[1]).endswith(" WARNING loss went up on 1")
        assert str(lines[0]).endswith(" step 1 loss 1.5")
        assert "stdout" not in str(lines[0])

        warnings = procs.logs(level="WARNING")
        assert sorted((line.rank, line.text) for line in warnings) == [
            (0, "loss went up on 0"),
            (1, "loss went up on 1"),
        ]
        assert warnings[0].level == logging.WARNING
        assert procs.logs(level="ERROR") == []
        # The record's printed form on stderr is not written a second time.
        assert [line.text for line in procs.logs(ranks=[0], grep="went up")] == [
            "loss went up on 0"
        ]
        # ... nor its traceback; an unprinted record hides no print() that follows it.
        procs.exec(
            "import logging\n"
            "log = logging.getLogger('quiet')\n"
            "log.setLevel(logging.INFO)\n"
            "log.propagate = False\n"
            "log.info('epoch 1')\n"
            "print('epoch 1')\n"
            "try:\n"
            "    1 / 0\n"
            "except ZeroDivisionError:\n"
            "    logging.exception('it broke')\n"
        ).get(timeout=60)
        assert [(line.stream, line.text) for line in procs.logs(ranks=[0], grep="epoch 1")] == [
            ("INFO", "epoch 1"),
            ("stdout", "epoch 1"),
        ]
        recent = [(line.stream, line.text) for line in procs.logs(ranks=[0])]
        broke = recent[recent.index(("ERROR", "it broke")) :]
        assert broke[-1] == ("ERROR", "ZeroDivisionError: division by zero")
        assert {stream for stream, _ in broke} == {"ERROR"}  # printed form not repeated
        assert ("ERROR", "Traceback (most recent call last):") in broke
        assert [line.text for line in procs.logs(ranks=[0], grep="stderr")] == ["to stderr"]
        assert [line.text for line in procs.logs(tail=1, ranks=[0], grep="loss")] == [
            "step 2 loss 0.25"
        ]
        assert procs.logs(since=dt.datetime.now() + dt.timedelta(hours=1)) == []
        assert len(procs.logs(since="1h", grep="loss")) == 6
        assert procs.logs(ranks=[0], grep="loss", since=3600) == procs.logs(
            ranks=[0], grep="loss", since=dt.timedelta(hours=1)
        )
    finally:
        procs.stop()


def test_a_multi_host_mesh_reads_each_hosts_files_through_its_agent():
    from test_multihost import local_hosts

    hosts = local_hosts(2)
    try:
        procs = hosts.spawn_procs({"procs": 1}, name=_unique("hosts"), echo_output=False)
        try:
            procs.exec("import logging\nlogging.error('disk full on %d', rank)").get(timeout=60)
            procs.kill([1])
            procs.restart()
            procs.exec("print(f'back on {rank}')").get(timeout=60)
            lines = procs.logs(grep="disk full|back on", since="1h")
            assert sorted((line.rank, line.stream, line.text) for line in lines) == [
                (0, "ERROR", "disk full on 0"),
                (0, "stdout", "back on 0"),
                (1, "ERROR", "disk full on 1"),
                (1, "stdout", "back on 1"),
            ]
            assert [line.text for line in procs.logs(ranks=[1], level="ERROR")] == [
                "disk full on 1"
            ]
            last = procs.logs(tail=1, grep="back")
            assert len(last) == 1
            assert last == procs.logs(grep="back")[-1:]
            with pytest.raises(MeshUsageError, match=r"grep='\[' is not a regular expression"):
                procs.logs(grep="[")
        finally:
            procs.stop()
    finally:
        hosts.shutdown()


def test_log_files_are_private_and_rotate_by_size():
    name = _unique("rotate")
    env = {"MONARCH_NB_LOG_MAX_BYTES": "2000", "MONARCH_NB_LOG_BACKUPS": "2"}
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name, echo_output=False, env=env)
    try:
        procs.exec("for i in range(200):\n    print(f'line {i:04d}')").get(timeout=60)
    finally:
        procs.stop()
    folder = _logs.mesh_dir(name)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(_logs.log_root()).st_mode) == 0o700
    files = sorted(os.listdir(folder))
    assert files == ["0.log", "0.log.1", "0.log.2"]
    for file in files:
        assert stat.S_IMODE(os.stat(os.path.join(folder, file)).st_mode) == 0o600
        assert os.path.getsize(os.path.join(folder, file)) < 2000 + 200
    kept = [line.text for line in _logs.read(name, [0])]
    assert kept == sorted(kept)
    assert kept[-1] == "line 0199"
    assert 20 < len(kept) < 200  # older lines rotated away


def test_no_files_when_turned_off():
    name = _unique("off")
    env = {"MONARCH_NB_LOG_FILES": "0"}
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name, echo_output=False, env=env)
    try:
        procs.exec("print('not kept')").get(timeout=60)
        assert procs.logs() == []
    finally:
        procs.stop()
    assert not os.path.exists(_logs.mesh_dir(name))


def test_a_new_mesh_of_the_same_name_reads_only_its_own_run():
    name = _unique("again")
    with this_host().spawn_procs(per_host={"procs": 2}, name=name, echo_output=False) as first:
        first.exec("print(f'first run {rank}')").get(timeout=60)
    with this_host().spawn_procs(per_host={"procs": 2}, name=name, echo_output=False) as second:
        second.exec("print(f'second run {rank}')").get(timeout=60)
        assert [line.text for line in second.logs(ranks=[1], grep="run")] == ["second run 1"]
        assert second.logs(grep="first run") == []
        # Earlier runs of the name stay searchable on purpose, oldest first.
        every = second.logs(ranks=[1], grep="run", runs="all")
        assert [line.text for line in every] == ["first run 1", "second run 1"]
        # An earlier since= than the run's start still means this run only.
        assert len(second.logs(grep="run", since="1h")) == 2
        with pytest.raises(MeshUsageError, match=r"runs='last' is not a choice: use 'this'"):
            second.logs(runs="last")


def test_logs_checks_its_arguments(procs2):
    with pytest.raises(MeshUsageError, match=r"since='yesterday' is not a time"):
        procs2.logs(since="yesterday")
    with pytest.raises(MeshUsageError, match=r"level='LOUD' is not a logging level"):
        procs2.logs(level="LOUD")
    with pytest.raises(MeshUsageError, match=r"grep='\(' is not a regular expression"):
        procs2.logs(grep="(")
    with pytest.raises(MeshUsageError, match=r"tail=-1 must be a non-negative int"):
        procs2.logs(tail=-1)
    with pytest.raises(MeshUsageError, match=r"rank 7 is not in this mesh; its ranks are 0-1"):
        procs2.logs(ranks=[7])


# -- the format, without processes ----------------------------------------------------------


def test_lines_parse_and_filter(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "0.log.1").write_text("2026-01-01T10:00:00.000+00:00 stdout old\n")
    (folder / "0.log").write_text(
        "2026-01-01T10:00:01.500+00:00 stdout a b  c\n"
        "torn line\n"
        "2026-01-01T10:00:02.000+00:00 ERROR boom\n"
    )
    (folder / "1.log").write_text("2026-01-01T10:00:01.000+00:00 stderr from one\n")
    lines = _logs.read("m", [0, 1], root=str(tmp_path))
    assert [(line.rank, line.text) for line in lines] == [
        (0, "old"),
        (1, "from one"),
        (0, "a b  c"),
        (0, "boom"),
    ]
    assert str(lines[2]) == "[0] 2026-01-01 10:00:01.500 a b  c"
    assert str(lines[3]) == "[0] 2026-01-01 10:00:02.000 ERROR boom"
    assert lines[3] == LogLine(
        0, dt.datetime(2026, 1, 1, 10, 0, 2, tzinfo=dt.timezone.utc), "ERROR", "boom"
    )
    after = dt.datetime(2026, 1, 1, 10, 0, 1, tzinfo=dt.timezone.utc)
    assert [line.text for line in _logs.read("m", [0, 1], since=after, root=str(tmp_path))] == [
        "from one",
        "a b  c",
        "boom",
    ]
    assert _logs.read("m", [1], level="info", root=str(tmp_path)) == []
    assert _logs.read("m", [5], root=str(tmp_path)) == []


@pytest.mark.parametrize(
    ("since", "seconds"),
    [(300, 300), ("5m", 300), ("2h", 7200), ("30s", 30), ("1d", 86400), ("90", 90)],
)
def test_since_reads_durations(since, seconds):
    before = dt.datetime.now().astimezone()
    parsed = _logs.parse_since(since)
    assert parsed is not None
    assert abs((before - parsed).total_seconds() - seconds) < 5


def test_log_files_are_never_written_through_a_link(tmp_path):
    from monarch_nb._worker._log_file import RankLog

    target = tmp_path / "victim"
    target.write_text("")
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    with pytest.raises(PermissionError, match=r"is not a directory of this user's"):
        _logs.make_private_dir(str(tmp_path / "linked"))
    (tmp_path / "real" / "0.log").symlink_to(target)
    with pytest.raises(OSError, match=r"Too many levels of symbolic links"):
        RankLog(str(tmp_path / "real" / "0.log"), 1000, 1)
    assert target.read_text() == ""
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    _logs.make_private_dir(str(open_dir))
    assert stat.S_IMODE(os.stat(open_dir).st_mode) == 0o700


def test_mesh_names_are_safe_directory_names(tmp_path):
    assert _logs.mesh_dir("a/../b c", str(tmp_path)) == str(tmp_path / "a_.._b_c")
    assert _logs.mesh_dir("..", str(tmp_path)) == str(tmp_path / "__")


# -- logging_option ---------------------------------------------------------------------------


def _event(rank: int, line: str, stream: str = "stdout", end: str = "\n") -> Output:
    return Output("procs", rank, stream, line, end)


def test_aggregation_folds_identical_lines_from_8_ranks():
    printed: list[tuple[str, str]] = []
    printer = OutputPrinter(lambda stream, text: printed.append((stream, text)))
    printer.configure(True, 60)
    for rank in (3, 1, 0, 2, 7, 5, 4, 6):
        printer(_event(rank, "epoch 3 done"))
    printer(_event(2, "only two"))
    printer(_event(0, "epoch 3 done", stream="stderr"))
    assert printed == []  # held until the window ends
    printer.flush()
    assert printed == [
        ("stdout", "[0-7] epoch 3 done\n"),
        ("stdout", "[2] only two\n"),
        ("stderr", "[0] epoch 3 done\n"),
    ]


def test_without_aggregation_lines_print_at_once_and_can_be_silenced():
    printed: list[str] = []
    printer = OutputPrinter(lambda stream, text: printed.append(text))
    printer(_event(1, "hello"))
    assert printed == ["[1] hello\n"]
    printer.configure(False, None)
    printer(_event(1, "quiet"))
    assert printed == ["[1] hello\n"]
    printer.configure(True, 60)
    printer(_event(0, "held"))
    printer(_event(0, " 50%", end="\r"))  # a progress redraw is not held, nor reordered
    assert printed == ["[1] hello\n", "[0] held\n", "[0]  50%\r"]


def test_logging_option_checks_its_arguments(procs2):
    with pytest.raises(MeshUsageError, match=r"aggregate_window_sec must be a positive"):
        procs2.logging_option(aggregate_window_sec=0)
    with pytest.raises(MeshUsageError, match=r"stream_to_client must be True or False"):
        procs2.logging_option(stream_to_client="yes")
    assert procs2.logging_option().get() is None
    assert procs2.logging_option(level=logging.INFO).get() is None
    with pytest.raises(MeshUsageError, match=r"logging_option\(level='LOUD'\): Unknown level"):
        procs2.logging_option(level="LOUD")
    procs2.logging_option(level=logging.WARNING)
    levels = procs2.run("__import__('logging').getLogger().level").values()
    assert levels == [logging.WARNING] * 2


def test_logging_option_aggregates_a_real_meshs_lines(capsys):
    procs = this_host().spawn_procs(per_host={"procs": 4}, name=_unique("agg"))
    log = EventLog()
    try:
        procs.logging_option(stream_to_client=True, aggregate_window_sec=120)
        with procs.events.subscribe(log, kinds=(Output,)):
            procs.exec("print('epoch 3 done')").get(timeout=60)
            _wait_for_lines(log, "epoch 3 done", 4)
        procs.logging_option(aggregate_window_sec=None)  # prints what was held
        assert capsys.readouterr().out == "[0-3] epoch 3 done\n"
    finally:
        procs.stop()


def test_the_option_is_kept_on_the_mesh_for_every_view_and_printer(procs2):
    try:
        assert procs2.output_option == (True, None)
        procs2.slice(procs=1).logging_option(stream_to_client=False, aggregate_window_sec=3)
        assert procs2.output_option == (False, 3.0)
    finally:
        procs2.logging_option()


def test_a_log_dir_of_another_user_is_refused_and_the_controller_says_so_once(
    tmp_path, monkeypatch, caplog, capsys
):
    # Another user (uid 65534) pre-made MONARCH_NB_LOG_DIR: every rank rightly
    # refuses it; the controller warns once, not once per rank, with what to do.
    if os.getuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setenv("MONARCH_NB_LOG_DIR", str(theirs))
    caplog.set_level(logging.WARNING, logger="monarch_nb")
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=_unique("refused"))
    try:
        printed = ""

        def both_ranks_refused() -> bool:
            nonlocal printed
            printed += capsys.readouterr().err
            return all(f"[{r}] monarch_nb: no log file for this rank" in printed for r in (0, 1))

        wait_until(both_ranks_refused, 60, "both ranks' refusals")
        assert procs.run("1", timeout=30).values() == [1, 1]  # the ranks run without files
    finally:
        procs.stop()
    told = [r.getMessage() for r in caplog.records if "keeps no rank log files" in r.getMessage()]
    assert len(told) == 1, told
    assert re.search(
        rf"^monarch_nb: mesh '{procs.name}' keeps no rank log files, so procs\.logs\(\) will "
        rf"not find its lines \(rank [01]: {re.escape(str(theirs))} is not a directory of this "
        r"user's .*\)\. Set MONARCH_NB_LOG_DIR to a directory that only you own and can write "
        r"\(or unset it for ~/\.monarch_nb/logs\), then start the mesh again$",
        told[0],
    )
    assert os.listdir(theirs) == []  # nothing written into the other user's directory
