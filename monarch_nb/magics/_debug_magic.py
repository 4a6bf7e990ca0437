"""``%mesh debug [--rank R] [--mesh NAME]`` and the debugger's installation in a kernel.

The prompt itself lives in :mod:`monarch_nb.debug`; here only the options
are parsed and errors turned into IPython's UsageError.
"""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError

from .. import debug
from .._model._errors import MeshUsageError
from ._registry import REGISTRY

USAGE = "%mesh debug [--rank R] [--mesh NAME]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(f"{message}; usage: {USAGE}")


_parser = _Parser(prog="%mesh debug", add_help=False)
_parser.add_argument("--rank", type=int, default=None)
_parser.add_argument("--mesh", default=None)


def install() -> None:
    """Breakpoints on ranks started from now on prompt in the cell that waits for them."""
    debug.install()


def debug_line(rest: str) -> None:
    """Post-mortem: pdb at the frame where the rank's last failed call raised."""
    args = _parser.parse_args(rest.split())
    try:
        mesh = REGISTRY.get(args.mesh)
        debug.post_mortem(mesh.procs, args.rank)
    except MeshUsageError as exc:
        raise UsageError(str(exc)) from None
