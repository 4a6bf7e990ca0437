"""The IPython extension: ``%mesh`` and ``%%mesh``, thin adapters over ``_registry``.

Loaded by ``%load_ext monarch_nb``. Unloading stops every mesh; so does the
kernel's exit (an atexit hook here, and the core kills what is left).
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display

from .._model import _hints
from .._model._errors import (
    CallTimeout,
    MeshFailure,
    MeshUsageError,
    ProfilerUnavailable,
    RemoteError,
    StuckRanksKilled,
    ipython_lines,
    set_ipython_style,
)
from .._model._value_mesh import ValueMesh
from ..widgets import _render
from . import _debug_magic, _options, _run_script
from ._autorun import AutoRun
from ._frontend import IPythonFrontend
from ._panel import register_panel, reveal_panel
from ._quiet_replay import replay_restart
from ._registry import REGISTRY, CellHandle, NotebookMesh
from ._selection import select
from ._stop import arm_idle_stop
from ._tracebacks import IPythonStyle, restart_hint


def _usage(exc: MeshUsageError) -> UsageError:
    return UsageError(str(exc))


def cell_number(shell: Any) -> int:
    """The running cell's ``In [N]``.

    IPython 8 counts a cell up after it ran, IPython 9 before it runs, so
    ``shell.execution_count`` is N on one and N + 1 on the other. The result
    IPython fills in for the running cell holds N on both.
    """
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(result, "execution_count", None)
    return number if isinstance(number, int) else shell.execution_count


@magics_class
class MeshMagics(Magics):
    """``%mesh`` (start, stop, restart, status, dashboard, push, pull, on, off, activate,
    deactivate) and ``%%mesh``."""

    shell: Any  # the InteractiveShell: set by Magics.__init__, never None once loaded

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.registry = REGISTRY
        self.autorun: AutoRun | None = None
        self.activation: Any = None  # monarch_nb.tensor's Activation, while %mesh activate
        # Whether the cell running now counts in the notebook's history: only then
        # is its execution count its own (nbval runs every cell as In [1]).
        self.counted = False

    def pre_run_cell(self, info: Any) -> None:
        """IPython's ``pre_run_cell`` event: remember whether this cell is counted."""
        self.counted = bool(getattr(info, "store_history", False))

    # -- %mesh ------------------------------------------------------------------------

    @line_magic("mesh")
    def mesh_line(self, line: str) -> Any:
        command, _, rest = line.strip().partition(" ")
        if not command:
            if self.registry.all():
                return self._status(_options.parse(_options.status_options, "--all"))
            display(_render.Notice(_options.line_help()))
            return None
        if command == "debug":  # the pdb bridge: see _debug_magic
            return _debug_magic.debug_line(rest)
        if command == "run":  # a torchrun-style script on the mesh: see _run_script
            try:
                _run_script.run_line(self.registry, rest)
            except MeshUsageError as exc:
                raise _usage(exc) from None
            return None
        if command in ("activate", "deactivate"):  # the tensor engine: ProcMesh.activate()
            return self._activate(command, rest.strip())
        if command in ("help", "-h", "--help"):
            display(_render.Notice(_options.line_help()))
            return None
        func = _options.SUBCOMMANDS.get(command)
        if func is None:
            raise UsageError(
                f"unknown %mesh command {command!r}; use one of "
                f"{', '.join(_options.SUBCOMMANDS)} (see %mesh?)"
            )
        try:
            if command in ("push", "scatter"):
                return self._assign(command, rest)
            args = _options.parse(func, rest)
            return getattr(self, f"_{command}")(args)
        except MeshUsageError as exc:
            raise _usage(exc) from None

    def _activate(self, command: str, name: str) -> None:
        """``%mesh activate [NAME]``: torch in the cells that follow runs on that mesh
        (as inside ``with procs.activate():``) until ``%mesh deactivate``."""
        activation, self.activation = self.activation, None
        if activation is not None:
            activation.exit()  # sends what is pending; raises if the mesh failed
        if command == "deactivate":
            display(_render.Notice("%mesh deactivate: torch runs in this kernel again"))
            return
        try:
            mesh = self.registry.get(name or None)
        except MeshUsageError as exc:
            raise _usage(exc) from None
        self.activation = mesh.procs.activate()
        self.activation.enter()
        display(
            _render.Notice(
                f"%mesh activate: torch now runs on mesh {mesh.name!r} "
                "(monarch_nb.inspect(t, ...) reads values); %mesh deactivate to stop"
            )
        )

    def _start(self, args: Any) -> None:
        for option in ("procs", "gpus"):
            value = getattr(args, option)
            if value is not None and value < 1:
                raise UsageError(f"--{option} must be at least 1, got {value}")
        mesh = self.registry.start(
            procs=args.procs,
            gpus=args.gpus,
            dist=args.dist,
            name=args.name,
            env=_options.parse_env(args.env),
            ordered=args.ordered,
            hosts=_options.hosts_starter(args),
            force=args.force,
        )
        if args.no_dashboard:
            display(_render.StatusView([mesh.status()]))
        else:
            display(mesh.dashboard())

    def _dashboard(self, args: Any) -> None:
        mesh = self.registry.get(args.mesh)
        if args.side:
            if reveal_panel(self.shell, mesh.name):
                display(_render.Notice(f"mesh {mesh.name!r} is in the Mesh side panel"))
                return
            display(
                _render.Notice(
                    "no JupyterLab Mesh panel is connected to this kernel (Notebook 7, "
                    "VS Code, or JupyterLab without monarch_nb's extension): the "
                    "dashboard is shown here"
                )
            )
        display(mesh.dashboard())

    def _stop(self, args: Any) -> None:
        meshes = self.registry.all() if args.all else [self.registry.get(args.mesh)]
        if self.activation is not None and self.activation.procs.name in {m.name for m in meshes}:
            try:
                self._activate("deactivate", "")
            except MeshFailure:
                pass  # a failed mesh is stopped all the same
        for mesh in meshes:
            mesh.stop()
            display(_render.Notice(f"mesh {mesh.name!r} stopped"))
        if self.autorun is not None and self.registry.default is None:
            self._off(None)

    def _restart(self, args: Any) -> None:
        mesh = self.registry.get(args.mesh)
        if args.replay:
            _, summary = replay_restart(
                mesh, args.ranks, show_output=args.show_output, skip_display=args.skip_display
            )
            display(_render.Notice(summary))
        else:
            if args.show_output or args.skip_display:
                raise UsageError("--show-output and --skip-display go with --replay")
            mesh.restart(args.ranks)
        display(mesh.dashboard())  # live, following the new processes

    def _resize(self, args: Any) -> None:
        if args.procs < 1:
            raise UsageError(f"--procs must be at least 1, got {args.procs}")
        self._reshape(self.registry.get(args.mesh), lambda mesh: mesh.resize(args.procs))

    def _grow(self, args: Any) -> None:
        if args.count < 1:
            raise UsageError(f"%mesh grow takes a count of at least 1, got {args.count}")
        self._reshape(self.registry.get(args.mesh), lambda mesh: mesh.grow(args.count))

    def _reshape(self, mesh: NotebookMesh, change: Callable[[NotebookMesh], object]) -> None:
        """Resize ``mesh``; ``%mesh activate`` follows it to the new mesh."""
        active = self.activation is not None and self.activation.procs.name == mesh.name
        if active:
            try:
                self._activate("deactivate", "")
            except MeshFailure:
                pass  # what was pending went to a rank that died: lost with it
        change(mesh)
        if active:
            self._activate("activate", mesh.name)
        display(_render.Notice(f"mesh {mesh.name!r} now has {len(mesh)} rank(s), numbered from 0"))
        display(_render.StatusView([mesh.status()]))

    def _history(self, args: Any) -> None:
        mesh = self.registry.get(args.mesh)
        display(_render.Notice(f"history of mesh {mesh.name!r}:\n{mesh.procs.history()}"))

    def _status(self, args: Any) -> None:
        meshes = self.registry.all() if args.all else [self.registry.get(args.mesh)]
        display(_render.StatusView([m.status() for m in meshes]))

    def _logs(self, args: Any) -> None:
        mesh = self.registry.get(args.mesh)
        lines = mesh.logs(
            ranks=args.ranks,
            where=args.where,
            grep=_options.unquote(args.grep),
            since=_options.unquote(args.since),
            level=args.level,
            tail=args.tail,
            runs=args.runs,
        )
        display(_render.LogView(lines))

    def _why(self, args: Any) -> None:
        display(self.registry.get(args.mesh).procs.diagnose(timeout=args.timeout))

    def _timeline(self, args: Any) -> None:
        procs = select(self.registry.get(args.mesh).procs, args.ranks, args.where)
        try:
            display(procs.timeline(minutes=args.minutes))
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def _stacks(self, args: Any) -> None:
        procs = self.registry.get(args.mesh).procs
        try:
            display(procs.stacks(native=args.native))
        except ProfilerUnavailable as exc:
            raise UsageError(str(exc)) from None

    def _profile(self, args: Any) -> None:
        procs = self.registry.get(args.mesh).procs
        try:
            display(procs.profile(args.seconds, native=args.native))
        except ProfilerUnavailable as exc:
            raise UsageError(str(exc)) from None

    def _assign(self, command: str, rest: str) -> None:
        """``%mesh push NAME=EXPR ...`` (every rank gets the value) and ``%mesh scatter
        NAME=EXPR ...`` (each rank gets its chunk)."""
        try:
            options, pairs = _options.split_assignments(rest)
        except UsageError as exc:
            raise UsageError(f"%mesh {command}: {exc}") from None
        args = _options.parse(_options.SUBCOMMANDS[command], options)
        if not pairs:
            raise UsageError(f"%mesh {command} needs NAME=EXPR, e.g. %mesh {command} x=data")
        values = {}
        for name, expression in pairs:
            values[name] = self.shell.ev(expression)  # a local error shows as a local one
        mesh = self.registry.get(args.mesh)
        if command == "push":
            mesh.push(values, ranks=args.ranks, where=args.where)
            return
        for name, value in values.items():
            mesh.scatter(name, value, ranks=args.ranks, where=args.where)

    def _gather(self, args: Any) -> Any:
        mesh = self.registry.get(args.mesh)
        return mesh.gather(args.name, ranks=args.ranks, where=args.where)

    def _pull(self, args: Any) -> ValueMesh[Any]:
        mesh = self.registry.get(args.mesh)
        return mesh.pull(args.name, ranks=args.ranks, where=args.where)

    def _on(self, args: Any) -> None:
        mesh = self.registry.get(args.mesh)
        mesh_options = f"--mesh {mesh.name}"
        if args.ranks:
            mesh_options += f" --ranks {args.ranks}"
        for clause in args.where or ():
            mesh_options += f" --where {clause}"
        self._off(None)
        self.autorun = AutoRun(mesh_options)
        self.shell.input_transformers_post.append(self.autorun)
        display(
            _render.Notice(
                f"%mesh on: plain cells now run on mesh {mesh.name!r}; %mesh off to stop"
            )
        )

    def _off(self, args: Any) -> None:
        if self.autorun is not None:
            try:
                self.shell.input_transformers_post.remove(self.autorun)
            except ValueError:
                pass
            self.autorun = None
            if args is not None:
                display(_render.Notice("%mesh off: plain cells run in this kernel again"))

    # -- %%mesh -----------------------------------------------------------------------

    @cell_magic("mesh")
    def mesh_cell(self, line: str, cell: str) -> CellHandle | None:
        args = _options.parse(_options.cell_options, line)
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
        if args.ordered and args.live:
            raise UsageError("give --ordered or --live, not both")
        if not args.out.isidentifier():
            raise UsageError(f"--out {args.out!r} is not a Python name")
        try:
            mesh = self.registry.get(args.mesh)
        except MeshUsageError as exc:
            raise _usage(exc) from None
        ordered = True if args.ordered else (False if args.live else None)
        if args.auto:
            display(_render.Notice(f"── on mesh {mesh.name!r} (%mesh off to run here) ──"))
        try:
            result = mesh.run(
                cell,
                ranks=args.ranks,
                where=args.where,
                timeout=args.timeout,
                block=not args.no_block,
                ordered=ordered,
                fail_fast=args.fail_fast,
                replay=not args.no_replay,
                figures=args.figures,
                # <mesh-cell-N> is In [N]; an uncounted cell takes the next of our own count.
                number=cell_number(self.shell) if self.counted else None,
                on_done=self._done_callback(mesh, args.out) if args.no_block else None,
            )
        except MeshUsageError as exc:
            raise _usage(exc) from None
        except (KeyboardInterrupt, CallTimeout) as exc:
            raise _without_local_frames(exc) from None
        except SyntaxError as exc:
            raise _LocalSyntaxError(self.shell, exc) from None
        if isinstance(result, CellHandle):
            arm_idle_stop(self.shell, self.registry)  # the stop button reaches it
            return result
        self.shell.user_ns[args.out] = result
        if not _render.all_none(result):
            display(_FoldedValues(result))
        return None

    def _done_callback(self, mesh: NotebookMesh, out: str) -> Any:
        """On completion of a non-blocking cell: store, then show value or error in its cell."""
        shell = self.shell

        def done(future: Any, cell: Any) -> None:
            error = future.exception(timeout=0)
            frontend = cell.frontend
            if error is None:
                value = future.get(timeout=0)
                shell.user_ns[out] = value
                if not _render.all_none(value):
                    frontend.display(cell.parent, {"text/plain": _render.fold_values(value)}, {})
                return
            if isinstance(error, StuckRanksKilled):
                return  # the stop that killed its ranks says so, once (see _stop)
            render = getattr(error, "_render_traceback_", None)
            lines = render() if render else [f"{type(error).__name__}: {error}"]
            frontend.write(cell.parent, "stderr", "\n".join(lines) + "\n")

        return done


class _FoldedValues:
    """Displays a ValueMesh folded: ``[0-3] tensor([6., 6.])``."""

    def __init__(self, values: ValueMesh[Any]) -> None:
        self.values = values

    def __repr__(self) -> str:
        return _render.fold_values(self.values)


def _without_local_frames(exc: BaseException) -> BaseException:
    """Show ``exc`` as its message, then where each rank was, not our own frames."""
    lines = [f"{type(exc).__name__}: {exc}"]
    if isinstance(exc.__cause__, RemoteError):
        lines += ["--- where the ranks were:", *exc.__cause__.render().splitlines()[1:]]
    shown = ipython_lines(exc, lines)
    exc._render_traceback_ = lambda: shown  # type: ignore[attr-defined]  # IPython's hook
    return exc


class _LocalSyntaxError(Exception):
    """A %%mesh cell that does not compile, shown exactly like a local SyntaxError.

    Raising the SyntaxError itself would show our magic's frames; IPython
    renders this one through ``_render_traceback_`` with none, and front ends
    (nbval, nbconvert) see ``ename == "SyntaxError"``.
    """

    def __init__(self, shell: Any, error: SyntaxError) -> None:
        super().__init__(str(error))
        self.shell, self.error = shell, error

    def _render_traceback_(self) -> list[str]:
        return self.shell.SyntaxTB.structured_traceback(SyntaxError, self.error, [])


_LocalSyntaxError.__name__ = _LocalSyntaxError.__qualname__ = "SyntaxError"


MeshMagics.mesh_line.__doc__ = _options.line_help()
MeshMagics.mesh_cell.__doc__ = _options.cell_help()

_loaded: dict[int, MeshMagics] = {}


def load_ipython_extension(shell: Any) -> None:
    if id(shell) in _loaded:
        return
    magics = MeshMagics(shell)
    shell.register_magics(magics)
    REGISTRY.router.frontend = IPythonFrontend(shell)
    _loaded[id(shell)] = magics
    atexit.register(REGISTRY.stop_all)
    register_panel(shell)  # the JupyterLab Mesh panel's comm (labextension/)
    shell.events.register("pre_run_cell", magics.pre_run_cell)
    set_ipython_style(IPythonStyle(shell))  # remote errors in IPython's colours
    _hints.set_restart_hint(restart_hint)  # "run %mesh restart", not the method
    _debug_magic.install()  # breakpoint() on a rank prompts in the waiting cell


def unload_ipython_extension(shell: Any) -> None:
    magics = _loaded.pop(id(shell), None)
    if magics is None:
        return
    magics._off(None)
    shell.events.unregister("pre_run_cell", magics.pre_run_cell)
    if magics.activation is not None:
        magics.activation.exit()
    REGISTRY.stop_all()
    atexit.unregister(REGISTRY.stop_all)
    set_ipython_style(None)
    _hints.set_restart_hint(None)
    for kind in ("line", "cell"):
        shell.magics_manager.magics[kind].pop("mesh", None)
    display(_render.Notice("monarch_nb: every mesh stopped"))
