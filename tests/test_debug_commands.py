"""debug/_commands.py: the mesh commands at the (Pdb rank N) prompt; the rest is pdb's."""

from __future__ import annotations

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
