"""magics/_options.py: parsers, generated help, NAME=EXPR splitting."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from monarch_nb.magics import _options

pytestmark = pytest.mark.timeout(30)


def test_help_is_generated_from_the_argument_definitions():
    line = _options.line_help()
    for command in _options.SUBCOMMANDS:
        assert f"%mesh {command}" in line
    assert "--dist" in line
    assert "{gloo,nccl}" in line
    cell = _options.cell_help()
    for option in ("--ranks", "--where", "--timeout", "--out", "--no-block", "--ordered"):
        assert option in cell
    assert "--auto" not in cell


def test_bad_option_is_a_usage_error():
    with pytest.raises(UsageError, match="invalid choice: 'mpi'"):
        _options.parse(_options.start_options, "--dist mpi")
    with pytest.raises(UsageError, match="invalid int value: 'four'"):
        _options.parse(_options.start_options, "--procs four")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("x=1", ("", [("x", "1")])),
        ("--mesh m x=f(1, 2) y=3", ("--mesh m", [("x", "f(1, 2)"), ("y", "3")])),
        ("--where procs=0 lr=0.1", ("--where procs=0", [("lr", "0.1")])),
        ("a=dict(b=1, c=2)  d = [1, 2]", ("", [("a", "dict(b=1, c=2)"), ("d", "[1, 2]")])),
        ("x=a==b", ("", [("x", "a==b")])),
    ],
)
def test_split_assignments(line, expected):
    assert _options.split_assignments(line) == expected


def test_split_assignments_names_the_bad_part():
    with pytest.raises(UsageError, match="expected NAME=EXPR at '1 2'"):
        _options.split_assignments("1 2")
    with pytest.raises(UsageError, match="x= has no expression"):
        _options.split_assignments("x=")


def test_parse_env():
    assert _options.parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(UsageError, match="--env 'A'"):
        _options.parse_env(["A"])


def test_slurm_spec_parses_to_launcher_arguments():
    spec = "nodes=2,partition=gpu,gpus_per_node=8,time=1:00:00,account=ml"
    assert _options.parse_slurm(spec) == {
        "nodes": 2,
        "partition": "gpu",
        "gpus_per_node": 8,
        "time_limit": "1:00:00",
        "account": "ml",
    }
    with pytest.raises(UsageError, match="say how many nodes"):
        _options.parse_slurm("partition=gpu")
    with pytest.raises(UsageError, match="KEY one of nodes, partition"):
        _options.parse_slurm("nodes=2,queue=gpu")
    with pytest.raises(UsageError, match="not a number"):
        _options.parse_slurm("nodes=two")


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("--ssh a,b --slurm nodes=2", "one of --ssh, --slurm, --attach, not ssh and slurm"),
        ("--attach tcp://h:1", "--attach needs --key-file"),
        ("--key-file k", "--key-file goes with --attach"),
        ("--ssh-option=-v", "--ssh-option goes with --ssh"),
        ("--reverse", "--reverse goes with --ssh"),
    ],
)
def test_host_options_that_do_not_go_together(line, match):
    args = _options.parse(_options.start_options, line)
    with pytest.raises(UsageError, match=match):
        _options.hosts_starter(args)


def test_no_host_option_means_this_host():
    assert _options.hosts_starter(_options.parse(_options.start_options, "--procs 2")) is None
