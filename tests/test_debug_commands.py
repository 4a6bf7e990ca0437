"""debug/_commands.py: the mesh commands at the (Pdb rank N) prompt; the rest is pdb's."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from monarch_nb.debug._commands import (
    HELP,
    Attach,
    Cast,
    CommandError,
    ContinueAll,
    Help,
    PdbLine,
    Ranks,
    parse,
    parse_ranks,
)


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("ranks", Ranks()),
        ("help", Help()),
        ("attach 3", Attach(3)),
        ("  attach  12 ", Attach(12)),
        ("cast 0-3 p loss", Cast((0, 1, 2, 3), "p loss")),
        ("cast 1,3 pp {'a': x}", Cast((1, 3), "pp {'a': x}")),
        ("cast all w", Cast(None, "w")),
        ("continue all", ContinueAll()),
        ("c all", ContinueAll()),
        ("cont all", ContinueAll()),
    ],
)
def test_mesh_commands(line, command):
    assert parse(line) == command


@pytest.mark.parametrize(
    "line", ["n", "s", "c", "continue", "p x", "pp x", "l", "ll", "w", "u", "d", "b 3", "q", "x+1"]
)
def test_everything_else_goes_to_pdb_unchanged(line):
    assert parse(line) == PdbLine(line)


def test_ranks_and_help_with_arguments_are_pdb_expressions():
    # `ranks[0]` or `help(x)` are Python a user may evaluate in pdb.
    assert parse("ranks[0]") == PdbLine("ranks[0]")
    assert parse("help x") == PdbLine("help x")


def test_rank_sets():
    assert parse_ranks("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)
    assert parse_ranks("3,1,1") == (1, 3)
    assert parse_ranks("all") is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("attach", "attach needs one rank number, e.g. `attach 1`; got ''"),
        ("attach one", "attach needs one rank number"),
        ("cast 0-3", "cast needs ranks and a pdb command, e.g. `cast 0-3 p loss`"),
        ("cast x-y p 1", "'x-y' is not a rank set; write e.g. 0-3, 1,3 or all"),
        ("cast 3-1 p 1", "'3-1' is not a rank range"),
    ],
)
def test_malformed_mesh_commands_say_the_right_form(line, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace("`", "`")):
        parse(line)


def test_help_lists_every_mesh_command():
    for word in ("ranks", "attach R", "cast RANKS CMD", "continue all", "help"):
        assert word in HELP


@pytest.mark.parametrize(
    ("text", "size", "message"),
    [
        (
            "0-99999999999",
            None,
            "'0-99999999999' names rank 99999999999, which does not exist: "
            "no mesh has more than 65536 ranks",
        ),
        (
            "0-99999999999",
            2,
            "'0-99999999999' names rank 99999999999, which does not exist: the mesh has ranks 0-1",
        ),
        ("1,2", 2, "'2' names rank 2, which does not exist: the mesh has ranks 0-1"),
        ("0-1," + "9" * 5000, 2, "is not a rank set; write e.g. 0-3, 1,3 or all"),
    ],
)
def test_a_rank_set_past_the_ranks_that_exist_is_refused_before_it_is_expanded(text, size, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        parse_ranks(text, size)
    with pytest.raises(CommandError, match=re.escape(message)):
        parse(f"cast {text} p x", size)
    assert parse_ranks("0-1", 2) == (0, 1)


@pytest.mark.parametrize("rest", ["\u00b2", "9" * 5000, "-1"])
def test_attach_takes_a_plain_rank_number(rest):
    with pytest.raises(CommandError, match=r"attach needs one rank number, e\.g\. `attach 1`"):
        parse(f"attach {rest}")


def test_a_huge_cast_at_a_real_prompt_says_which_ranks_exist(tmp_path):
    # A script on a pipe: the prompt reads the answers from stdin. Before the bound,
    # the first line built a list of 10^11 ranks (MemoryError); now it is refused
    # and the session goes on.
    script = tmp_path / "huge_cast.py"
    script.write_text(
        "import monarch_nb.debug\n"
        "from monarch_nb import this_host\n"
        "monarch_nb.debug.install()\n"
        "with this_host().spawn_procs(per_host={'procs': 2}, echo_output=False) as procs:\n"
        "    print('values', procs.run('breakpoint()\\nrank * 10', timeout=120).values())\n"
    )
    answers = "cast 0-99999999999 p rank\ncast 0-1 p rank + 100\nc\nc\nc\n"
    out = subprocess.run(
        [sys.executable, str(script)],
        input=answers,
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "*** '0-99999999999' names rank 99999999999, which does not exist: "
        "the mesh has ranks 0-1" in out.stdout
    )
    assert "values [0, 10]" in out.stdout


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("attach trainers 1", Attach(1)),
        ("cast trainers ranks(1,3) p x", Cast((1, 3), "p x")),
        ("cast ranks(0:4) p x", Cast((0, 1, 2, 3), "p x")),
        ("cast t ranks(2) w", Cast((2,), "w")),
        ("cast t ranks(::3) w", Cast((0, 3, 6), "w")),
        ("cast t ranks(5:) w", Cast((5, 6, 7), "w")),
        ("cast t ranks(0:99999999999) w", Cast(tuple(range(8)), "w")),  # bounded first
    ],
)
def test_monarchs_spellings_of_attach_and_cast(line, command):
    assert parse(line, 8) == command


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("cast t ranks(a=1) p x", "ranks by dimension are not supported here"),
        ("cast t ranks(9) p x", "'9' names rank 9, which does not exist"),
        ("cast t ranks(x) p x", "'x' is not a rank set"),
        ("cast t ranks(1:2:3:4) p x", "is not a rank set; write e.g. ranks(0:4)"),
    ],
)
def test_monarchs_rank_sets_that_do_not_fit_say_what_does(line, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        parse(line, 8)
