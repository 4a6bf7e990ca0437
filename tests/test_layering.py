"""The house in layers (docs/layout.md): each package imports only those below it,
no module imports another in a circle, and no file or class outgrows a reader.

Every import counts: at module level, inside functions, and under
``if TYPE_CHECKING:``. A lower layer that must name a higher one's object
declares a small Protocol of its own instead. Read from the source (``ast``),
so nothing is imported here.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Iterator

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "monarch_nb"

# Lowest first. A module may import its own layer and those below it; the three
# processes share a layer and never import one another.
LAYERS: list[tuple[str, ...]] = [
    ("_model",),  # shapes, values, folding, errors, futures: no I/O
    ("_wire",),  # sockets, links, signing, serialisation, typed messages, keys
    ("native",),  # the one-sided tensor data plane (C)
    ("_runtime",),  # actors, endpoints, references, ports, peers, calls in flight
    ("_services",),  # logs, metrics, stacks, workspace, spmd, config, process hygiene
    ("_controller", "_worker", "_agent"),  # the three processes
    ("_jobs",),  # launchers and jobs: how a mesh gets its hosts
    ("tensor",),  # the tensor engine (torch)
    ("debug", "widgets"),  # the notebook's debugger prompt and its widgets
    ("magics",),  # %mesh, %%mesh, the dashboard panel
    ("", "job"),  # the face: monarch_nb/__init__.py, actor.py, rdma.py, job/, ...
]
SIDES = {"_controller", "_worker", "_agent"}
MAX_FILE_LINES = 800
MAX_CLASS_LINES = 500


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
# C extensions are modules too: each has a stub (``_memory.pyi``) or a Python twin.
EXTENSIONS = {module_name(p) for p in PACKAGE.rglob("*.pyi")} - set(MODULES)
PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, package) of a ``monarch_nb...`` module."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 2 or (len(parts) == 2 and module in PACKAGES) else ""
    for index, names in enumerate(LAYERS):
        if top in names:
            return index, top
    raise AssertionError(f"{module}: its package {top!r} is on no layer; add it to LAYERS")


def imports_of(module: str) -> Iterator[tuple[int, str]]:
    """(line, imported monarch_nb module) for every import in ``module``'s source."""
    if module in EXTENSIONS:
        return
    path = MODULES[module]
    package = module if module in PACKAGES else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("monarch_nb"):
                    yield node.lineno, _longest_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("monarch_nb"):
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                known = full in MODULES or full in EXTENSIONS
                yield node.lineno, full if known else _longest_module(target)


def _longest_module(name: str) -> str:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in MODULES or ".".join(parts[:k]) in EXTENSIONS:
            return ".".join(parts[:k])
    raise AssertionError(f"no module {name}")


GRAPH = {m: {t for _, t in imports_of(m)} - {m} for m in MODULES}


def test_every_package_is_on_a_layer():
    for module in MODULES:
        layer_of(module)


def test_each_layer_imports_only_the_layers_below_it():
    upward = []
    for module in MODULES:
        level, package = layer_of(module)
        for line, target in imports_of(module):
            target_level, target_package = layer_of(target)
            if target_level > level:
                upward.append(f"{module}:{line} imports {target} (a higher layer)")
            elif package in SIDES and target_package in SIDES and target_package != package:
                upward.append(f"{module}:{line} imports {target} (another process's side)")
    assert not upward, "\n".join(upward)


def test_c_sources_include_only_their_layer_and_below():
    # The C extensions follow the rule too: a header of another package is
    # included by a relative path, ``#include "../_wire/_sha256.h"``.
    upward = []
    for path in [*PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")]:
        level, _ = layer_of(module_name(path.with_suffix(".py")))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = re.match(r'#include "\.\./(\w+)/', line.strip())
            if match and layer_of(f"monarch_nb.{match[1]}")[0] > level:
                upward.append(f"{path.relative_to(PACKAGE)}:{number} includes {match[0]}")
    assert not upward, "\n".join(upward)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_another_in_a_circle():
    circles = cycles(GRAPH)
    described = [
        " -> ".join(m for m in circle) + "  (each imports another of them)" for circle in circles
    ]
    assert not circles, "\n".join(described)


def test_the_cycle_check_finds_a_circle():
    # The check itself can fail: a made-up circle of three.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _sources() -> Iterator[pathlib.Path]:
    yield from sorted(PACKAGE.rglob("*.py"))
    yield from sorted(PACKAGE.rglob("*.c"))


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_outgrows_a_reader(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.name}: {lines} lines (at most {MAX_FILE_LINES})"


def test_no_class_does_everything():
    big = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    big.append(f"{module}.{node.name}: {size} lines")
    assert not big, f"classes over {MAX_CLASS_LINES} lines: " + ", ".join(big)
