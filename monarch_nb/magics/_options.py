"""The options of ``%mesh`` and ``%%mesh``, declared once with ``magic_arguments``.

Each subcommand is a parser; ``%mesh?`` and ``%%mesh?`` show help generated
from these declarations (:func:`line_help`, :func:`cell_help`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, argument_group, magic_arguments

from ._registry import DIST_BACKENDS


def _mesh_option(func: Any) -> Any:
    return argument("--mesh", metavar="NAME", help="the mesh to use (default: the last started)")(
        func
    )


def _selection_options(func: Any) -> Any:
    func = argument(
        "--where",
        metavar="DIM=INDEX",
        action="append",
        help="select by dimension: procs=0, procs=0:2 or procs=1,3 (repeatable)",
    )(func)
    return argument(
        "--ranks", metavar="RANKS", help="run on these ranks only: 0,2-3 (default: all)"
    )(func)


@magic_arguments(name="mesh start")
@argument(
    "--no-dashboard",
    action="store_true",
    help="show the status table instead of the live dashboard",
)
@argument("--ordered", action="store_true", help="order every cell's output by rank")
@argument(
    "--force",
    action="store_true",
    help="start more than 64 ranks per CPU on a host (a benchmark of many light ranks)",
)
@argument(
    "--env", metavar="K=V", nargs="+", default=[], help="extra environment variables of the ranks"
)
@argument("--name", metavar="NAME", help="name of the mesh (default: mesh, mesh2, ...)")
@argument(
    "--dist",
    choices=DIST_BACKENDS,
    help="initialise torch.distributed on every rank with this backend; `dist` and "
    "`torch` are then predefined in cells",
)
@argument_group("hosts (default: this host)")
@argument(
    "--key-file", metavar="FILE", help="with --attach: the key file the agents were started with"
)
@argument(
    "--attach",
    metavar="ADDRS",
    help="use agents started elsewhere: tcp://host:port,... (monarch-nb agent --listen)",
)
@argument(
    "--slurm",
    metavar="SPEC",
    help="start agents with srun: nodes=2[,partition=P,gpus_per_node=G,time=T,account=A]",
)
@argument(
    "--ssh-option",
    metavar="OPT",
    action="append",
    default=[],
    help="an argument for ssh, e.g. --ssh-option=-F --ssh-option=cluster.conf (repeatable)",
)
@argument(
    "--reverse",
    action="store_true",
    help="with --ssh: the hosts cannot reach this machine (NAT); they dial back through ssh -R",
)
@argument("--ssh", metavar="HOSTS", help="start agents over ssh on these hosts: node1,node2")
@argument_group("size (default: --procs 2)")
@argument("--gpus", type=int, metavar="N", help="N ranks, one GPU each")
@argument("--procs", type=int, metavar="N", help="N CPU ranks")
def start_options() -> None:
    """Start a mesh of worker processes on this host (or, with --ssh, --slurm or
    --attach, the given size on every host) and show its live dashboard.

    The last started mesh is the default of every other command.
    """


@magic_arguments(name="mesh stop")
@argument("--all", action="store_true", help="stop every mesh")
@_mesh_option
def stop_options() -> None:
    """Stop a mesh's processes (the default mesh unless --mesh or --all)."""


@magic_arguments(name="mesh restart")
@argument(
    "--ranks",
    help="replace only these ranks' processes (e.g. 1 or 1,3): the others keep their "
    "namespaces and actors, and the actors of these ranks are spawned again",
)
@argument(
    "--replay",
    action="store_true",
    help="then run again, in order, the pushes, cells and spawns that built the ranks' "
    "state (%%mesh history lists them; cells run with --no-replay are left out); one "
    "line per step (replaying [3] (1/5)), its output not shown again",
)
@argument(
    "--show-output",
    action="store_true",
    help="with --replay: show what the replayed steps print and display, under their headers",
)
@argument(
    "--skip-display",
    action="store_true",
    help="with --replay: leave out cells that only display (every statement calls only "
    "print, display or plt.*, or names a value)",
)
@_mesh_option
def restart_options() -> None:
    """Replace every process with a fresh one (namespaces start empty again), or only
    those of --ranks; torch.distributed is set up again on every rank."""


@magic_arguments(name="mesh resize")
@argument(
    "--procs",
    type=int,
    required=True,
    help="how many ranks to keep: the first live ones, renumbered from 0 (the others stop)",
)
@_mesh_option
def resize_options() -> None:
    """Go on with fewer ranks over the running processes (after a failure, the
    survivors): each keeps its namespace and gets its new rank and world size;
    torch.distributed is set up again at the new size. Actors: spawn them again."""


@magic_arguments(name="mesh grow")
@argument("count", type=int, help="how many ranks to add")
@_mesh_option
def grow_options() -> None:
    """Add ranks after the live ones (fresh processes, empty namespaces); every rank
    gets the new world size, and torch.distributed is set up again."""


@magic_arguments(name="mesh history")
@_mesh_option
def history_options() -> None:
    """The pushes, cells and spawns sent to a mesh since it started (or last restarted
    without --replay), with how each ended: what %mesh restart --replay runs again."""


@magic_arguments(name="mesh status")
@argument("--all", action="store_true", help="every mesh")
@_mesh_option
def status_options() -> None:
    """A table of ranks: host, pid, state and current work."""


@magic_arguments(name="mesh dashboard")
@argument(
    "--side",
    action="store_true",
    help="show it in JupyterLab's Mesh side panel, which stays in view while you scroll "
    "(in a front end without the panel: here, as usual)",
)
@_mesh_option
def dashboard_options() -> None:
    """A live dashboard: a tile per rank (state, work, CPU, memory, heartbeat),
    failures as they happen, and any rank's last lines of output."""


@magic_arguments(name="mesh why")
@argument("--timeout", type=float, default=5.0, metavar="S", help="wait S s for each rank")
@_mesh_option
def why_options() -> None:
    """Why is it hanging? Which ranks wait in which torch.distributed collective,
    and where the ranks that have not entered it are instead."""


@magic_arguments(name="mesh timeline")
@argument("--minutes", type=float, default=10.0, metavar="M", help="the last M minutes (10)")
@_selection_options
@_mesh_option
def timeline_options() -> None:
    """Who ran which cell or call when, a row per rank, stragglers outlined: the
    rank that took more than 1.5x the median of the others on the same call."""


@magic_arguments(name="mesh stacks")
@argument("--native", action="store_true", help="Python and C/C++ frames of every thread (py-spy)")
@_mesh_option
def stacks_options() -> None:
    """Every rank's stack, identical stacks shown once with their ranks."""


@magic_arguments(name="mesh profile")
@argument("--seconds", type=float, default=5.0, metavar="S", help="how long to sample")
@argument("--native", action="store_true", help="include C/C++ frames")
@_mesh_option
def profile_options() -> None:
    """A flame graph per rank (py-spy), sampled for S seconds, shown in the cell."""


@magic_arguments(name="mesh push")
@argument("assignments", metavar="NAME=EXPR", nargs="*", help="EXPR is evaluated here")
@_selection_options
@_mesh_option
def push_options() -> None:
    """Set names on the ranks from expressions evaluated in this kernel."""


@magic_arguments(name="mesh pull")
@argument("name", metavar="NAME", help="a name defined on the ranks")
@_selection_options
@_mesh_option
def pull_options() -> None:
    """Bring NAME back from every rank as a ValueMesh (returned, so `x = %mesh pull x`)."""


@magic_arguments(name="mesh scatter")
@argument("assignments", metavar="NAME=EXPR", nargs="*", help="EXPR is evaluated here")
@_selection_options
@_mesh_option
def scatter_options() -> None:
    """Split each EXPR (a list, tuple, string, tensor or array, evaluated in this
    kernel) into one contiguous chunk per rank, in rank order, and set NAME to it."""


@magic_arguments(name="mesh gather")
@argument("name", metavar="NAME", help="a name defined on the ranks")
@_selection_options
@_mesh_option
def gather_options() -> None:
    """NAME from every rank, concatenated in rank order (`x = %mesh gather x`)."""


@magic_arguments(name="mesh on")
@_selection_options
@_mesh_option
def on_options() -> None:
    """Run every following plain cell on the mesh, as if it began with %%mesh."""


@magic_arguments(name="mesh off")
def off_options() -> None:
    """Run plain cells in this kernel again."""


@magic_arguments(name="mesh logs")
@argument("--tail", type=int, metavar="N", help="the last N matching lines only")
@argument("--level", metavar="LEVEL", help="logging records at LEVEL or above: WARNING")
@argument("--since", metavar="WHEN", help="lines since: 30s, 5m, 2h, 1d or an ISO time")
@argument("--grep", metavar="REGEX", help="lines whose text matches REGEX")
@argument(
    "--runs",
    choices=("this", "all"),
    default="this",
    help="this: lines since this mesh started (default); all: earlier runs of its name too",
)
@_selection_options
@_mesh_option
def logs_options() -> None:
    """Search what ranks printed and logged, kept in a file per rank (across restarts,
    and after a rank died): %mesh logs --ranks 1 --grep loss --since 5m"""


SUBCOMMANDS = {
    "start": start_options,
    "stop": stop_options,
    "restart": restart_options,
    "resize": resize_options,
    "grow": grow_options,
    "history": history_options,
    "status": status_options,
    "logs": logs_options,
    "dashboard": dashboard_options,
    "why": why_options,
    "timeline": timeline_options,
    "stacks": stacks_options,
    "profile": profile_options,
    "push": push_options,
    "pull": pull_options,
    "scatter": scatter_options,
    "gather": gather_options,
    "on": on_options,
    "off": off_options,
}


@magic_arguments(name="%mesh")
@argument("--auto", action="store_true", help=argparse.SUPPRESS)
@argument(
    "--fail-fast",
    action="store_true",
    help="when a rank raises, interrupt the others (killing those stuck outside Python "
    "after the grace period)",
)
@argument(
    "--live",
    action="store_true",
    help="stream output as it arrives, even in deterministic mode",
)
@argument(
    "--ordered",
    "--group-by-rank",
    "--group-outputs",
    action="store_true",
    help="hold output back and show it rank by rank when the cell ends "
    "(deterministic; also MONARCH_NB_DETERMINISTIC=1; ipyparallel's --group-outputs)",
)
@argument(
    "--figures",
    choices=("arrival", "rank", "grid"),
    default="arrival",
    help="figures (rich displays) as they arrive (default), held and shown in rank "
    "order when the cell ends, or as one grid captioned by rank",
)
@argument(
    "--no-replay",
    action="store_true",
    help="leave this cell out of what %%mesh restart --replay runs again",
)
@argument(
    "--no-block",
    action="store_true",
    help="return a handle at once; output still goes to this cell",
)
@argument(
    "--out",
    metavar="NAME",
    default="_mesh",
    help="store the ValueMesh of the last expression as NAME (default: _mesh)",
)
@argument(
    "--timeout",
    type=float,
    metavar="S",
    help="interrupt the ranks after S seconds (killing those stuck in C code)",
)
@_selection_options
@_mesh_option
def cell_options() -> None:
    """Run this cell on the ranks of a mesh.

    Each rank keeps its own namespace with `rank`, `world_size`, `local_rank`,
    `point` and `display` predefined. Output streams in while the cell runs,
    prefixed by rank; the last expression's value comes back from every rank,
    folded when equal, and is stored as a ValueMesh. An error on any rank
    fails the cell with one traceback per distinct error. Interrupting the
    kernel interrupts the busy ranks.
    """


def line_help() -> str:
    """The docstring of ``%mesh``: an overview, then every subcommand's help."""
    intro = (
        "Start, inspect and drive meshes of worker processes.\n\n"
        "  %mesh start --procs 4 --dist gloo   start 4 CPU ranks\n"
        "  %mesh status                        what each rank is doing\n"
        "  %mesh dashboard                     the same, live, with failures\n"
        "  %mesh logs --grep loss --since 5m   search what ranks printed and logged\n"
        "  %mesh push lr=0.1 / %mesh pull x    move values to / from the ranks\n"
        "  %mesh scatter x=data / gather x     split data across the ranks / join it\n"
        "  %mesh on / %mesh off                run plain cells on the mesh\n"
        "  %mesh stop / %mesh restart\n"
        "  %mesh resize --procs 3 / grow 1     fewer ranks (the survivors) / more ranks\n"
        "  %%mesh                              run a cell on the ranks (see %%mesh?)\n"
        "  %mesh                               status, or this help if no mesh runs\n"
    )
    return intro + "\n" + "\n\n".join(f.__doc__ or "" for f in SUBCOMMANDS.values())


def cell_help() -> str:
    return cell_options.__doc__ or ""


def unquote(value: str | None) -> str | None:
    """``"'logged by'"`` -> ``"logged by"``: IPython's parser keeps an option's quotes."""
    if value and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse(func: Any, argstring: str) -> Any:
    """Parse ``argstring`` with ``func``'s parser (UsageError on misuse)."""
    return func.parser.parse_argstring(argstring)


_ASSIGNMENT = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)")
_VALUED_OPTIONS = ("--mesh", "--ranks", "--where")


def split_assignments(argstring: str) -> tuple[str, list[tuple[str, str]]]:
    """``"--mesh m x=f(1, 2) y=3"`` -> ``("--mesh m", [("x", "f(1, 2)"), ("y", "3")])``.

    Leading options are taken word by word; expressions may contain spaces,
    so each is cut at the next ``NAME=``, not split like shell words.
    """
    rest = argstring.strip()
    options: list[str] = []
    while rest.startswith("-"):
        word, _, rest = rest.partition(" ")
        options.append(word)
        if word in _VALUED_OPTIONS:
            value, _, rest = rest.lstrip().partition(" ")
            options.append(value)
        rest = rest.lstrip()
    matches = []
    position = 0
    while position < len(rest):
        match = _ASSIGNMENT.match(rest, position)
        if match is None:
            raise UsageError(f"expected NAME=EXPR at {rest[position:]!r}")
        # Cut at the first later " NAME=" before which the expression is complete.
        cuts = [m.start() for m in _ASSIGNMENT.finditer(rest, match.end()) if m.start() > 0]
        cuts = [c for c in cuts if rest[c].isspace()] + [len(rest)]
        end = next(c for c in cuts if _is_expression(rest[match.end() : c]) or c == len(rest))
        expression = rest[match.end() : end].strip()
        if not expression:
            raise UsageError(f"{match.group(1)}= has no expression after '='")
        matches.append((match.group(1), expression))
        position = end
    return " ".join(options), matches


def _is_expression(text: str) -> bool:
    try:
        compile(text.strip(), "<push>", "eval")
    except SyntaxError:
        return False
    return True


_SLURM_KEYS = {
    "nodes": int,
    "partition": str,
    "gpus_per_node": int,
    "time": str,
    "account": str,
}


def parse_slurm(spec: str) -> dict[str, Any]:
    """``nodes=2,partition=gpu`` -> keyword arguments of ``slurm_hosts``."""
    kwargs: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        convert = _SLURM_KEYS.get(key.strip())
        if not eq or convert is None:
            raise UsageError(
                f"--slurm {spec!r}: write KEY=VALUE with KEY one of {', '.join(_SLURM_KEYS)}"
            )
        try:
            kwargs["time_limit" if key == "time" else key.strip()] = convert(value.strip())
        except ValueError:
            raise UsageError(f"--slurm {key}={value!r}: not a number") from None
    if "nodes" not in kwargs:
        raise UsageError(f"--slurm {spec!r}: say how many nodes, e.g. --slurm nodes=2")
    return kwargs


def hosts_starter(args: Any) -> Callable[[], Any] | None:
    """What starts the hosts ``%mesh start`` asked for, or None for this host only."""
    from .._jobs import _launchers

    chosen = [o for o in ("ssh", "slurm", "attach") if getattr(args, o)]
    if len(chosen) > 1:
        raise UsageError(f"give one of --ssh, --slurm, --attach, not {' and '.join(chosen)}")
    if args.key_file and not args.attach:
        raise UsageError("--key-file goes with --attach")
    if args.ssh_option and not args.ssh:
        raise UsageError("--ssh-option goes with --ssh")
    if args.reverse and not args.ssh:
        raise UsageError("--reverse goes with --ssh")
    if args.ssh:
        hosts, options, reverse = args.ssh, list(args.ssh_option), args.reverse
        return lambda: _launchers.ssh_hosts(hosts, ssh_options=options, reverse=reverse)
    if args.slurm:
        kwargs = parse_slurm(args.slurm)
        return lambda: _launchers.slurm_hosts(**kwargs)
    if args.attach:
        if not args.key_file:
            raise UsageError("--attach needs --key-file (the file the agents were started with)")
        addresses, key_file = args.attach.split(","), args.key_file
        return lambda: _launchers.attach(addresses, key_file=key_file)
    return None


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--env {item!r}: write KEY=VALUE")
        env[key] = value
    return env
