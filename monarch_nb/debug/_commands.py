"""The mesh-level commands typed at a ``(Pdb rank N)`` prompt; every other line is pdb's.

::

    ranks             which ranks are paused, and where
    attach R          send the next lines to rank R
    cast 0-3 p loss   run one pdb command on several ranks, outputs grouped
    continue all      continue every paused rank (also: c all, cont all)
    help              this list (pdb's own help: h)

Monarch's ``monarch debug`` spellings are understood too: ``attach NAME R``
and ``cast NAME ranks(1,3) CMD`` / ``ranks(0:4)`` / ``ranks(2)``. NAME (an
actor mesh's name there) does not narrow anything here: a pause is a
process's, and R is its rank in the mesh. ``list`` and ``continue`` stay
pdb's (Monarch's top-level prompt has no pdb under it to collide with).
"""

from __future__ import annotations

from dataclasses import dataclass

HELP = """\
Mesh commands (anything else goes to pdb on the attached rank):
  ranks             which ranks are paused, and where
  attach R          send the next commands to rank R
  cast RANKS CMD    run one pdb command on several ranks (RANKS: 0-3, 1,3 or all)
  continue all      continue every paused rank (c all)
  help              this list; pdb's own help is `h`
Monarch's spellings work too: attach NAME R, cast NAME ranks(1,3) CMD, ranks(0:4).
"""


class CommandError(ValueError):
    """A mesh command that does not parse; its message says the right form."""


@dataclass(frozen=True)
class Ranks:
    pass


@dataclass(frozen=True)
class Attach:
    rank: int


@dataclass(frozen=True)
class Cast:
    ranks: tuple[int, ...] | None  # None: every paused rank
    line: str


@dataclass(frozen=True)
class ContinueAll:
    pass


@dataclass(frozen=True)
class Help:
    pass


@dataclass(frozen=True)
class PdbLine:
    line: str  # for pdb on the attached rank


Command = Ranks | Attach | Cast | ContinueAll | Help | PdbLine


# Where the number of ranks is not known: no mesh is larger, and a range past it
# is refused before it is expanded.
MAX_RANKS = 1 << 16


def parse_ranks(text: str, size: int | None = None) -> tuple[int, ...] | None:
    """``"0-3"`` -> (0, 1, 2, 3); ``"1,3,5-6"``; ``"all"`` -> None (every paused rank).

    Every rank must be below ``size`` (the ranks that exist; MAX_RANKS if None):
    a range past it raises CommandError before anything is expanded.
    """
    if text == "all":
        return None
    limit = MAX_RANKS if size is None else size
    ranks: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise CommandError(f"{text!r} is not a rank set; write e.g. 0-3, 1,3 or all") from None
        if first < 0 or last < first:
            raise CommandError(f"{part!r} is not a rank range; write low-high, e.g. 0-3")
        if last >= limit:
            if size is not None:
                exist = f"the mesh has ranks 0-{limit - 1}"
            else:
                exist = f"no mesh has more than {limit} ranks"
            raise CommandError(f"{part!r} names rank {last}, which does not exist: {exist}")
        ranks.update(range(first, last + 1))
    return tuple(sorted(ranks))


def parse_monarch_ranks(text: str, size: int | None = None) -> tuple[int, ...]:
    """Monarch's ``ranks(2)``, ``ranks(1,4,6)``, ``ranks(start?:stop?:step?)``."""
    inner = text[len("ranks(") : -1] if text.startswith("ranks(") and text.endswith(")") else ""
    if "=" in inner:
        raise CommandError(
            f"{text!r}: ranks by dimension are not supported here; name the ranks, "
            "e.g. ranks(0:4) or 0-3"
        )
    limit = MAX_RANKS if size is None else size
    try:
        if ":" in inner:
            parts = [int(p) if p.strip() else None for p in inner.split(":")]
            if len(parts) > 3:
                raise ValueError
            if parts[1] is not None and parts[1] > limit:  # a bound before expanding
                parts[1] = limit
            chosen = range(limit)[slice(*parts)]
            return tuple(chosen)
        return parse_ranks(",".join(p.strip() for p in inner.split(",")), size) or ()
    except CommandError:
        raise
    except (ValueError, TypeError):
        raise CommandError(
            f"{text!r} is not a rank set; write e.g. ranks(0:4), ranks(1,3) or 0-3"
        ) from None


def parse(line: str, size: int | None = None) -> Command:
    """What ``line`` asks for; raises :class:`CommandError` for a malformed mesh command.

    ``size``: how many ranks the mesh has, the bound of ``cast``'s rank sets.
    """
    stripped = line.strip()
    word, _, rest = stripped.partition(" ")
    rest = rest.strip()
    match word:
        case "ranks" if not rest:
            return Ranks()
        case "help" if not rest:
            return Help()
        case "attach":
            named = rest.split()
            if len(named) == 2 and named[1].isdecimal():  # Monarch's `attach NAME R`
                rest = named[1]
            if not rest.isdecimal() or len(rest) > 9:
                raise CommandError(f"attach needs one rank number, e.g. `attach 1`; got {rest!r}")
            return Attach(int(rest))
        case "cast":
            targets, _, command = rest.partition(" ")
            if not targets.startswith("ranks(") and command.lstrip().startswith("ranks("):
                targets, _, command = command.lstrip().partition(" ")  # Monarch's NAME first
            if not targets or not command.strip():
                raise CommandError("cast needs ranks and a pdb command, e.g. `cast 0-3 p loss`")
            if targets.startswith("ranks("):
                return Cast(parse_monarch_ranks(targets, size), command.strip())
            return Cast(parse_ranks(targets, size), command.strip())
        case "continue" | "c" | "cont" if rest == "all":
            return ContinueAll()
    return PdbLine(line.rstrip("\n"))
