"""Build hooks for the optional C extensions and JupyterLab panel; metadata is in pyproject.toml.

The C extensions are optional: if one cannot be compiled (no C compiler, not
Linux), installation still succeeds; ``monarch_nb.native.RDMABuffer`` then raises
an error that says why the native data plane is unavailable, and the wire's
fast paths (``_wire/_fast*.c``) run in Python instead, with the same bytes.

The JupyterLab "Mesh" panel (``labextension/``) is optional too: when Node.js
and npm are on PATH, building a wheel or an sdist (``pip install .``, ``pip
install -e .``, ``python -m build``) builds it into ``monarch_nb/labextension/``
and ships it as data files, installed where JupyterLab finds prebuilt
extensions (``share/jupyter/labextensions/monarch-nb``); a wheel or sdist that
carries it installs without Node.js. Without Node.js (and no panel built
earlier) it says so and installs without the panel. Each step says what it
builds on stderr, which pip shows with ``-v``.
``MONARCH_NB_REQUIRE_LABEXTENSION=1`` makes a missing or failed build an error.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.editable_wheel import editable_wheel


def progress(message: str) -> None:
    """Say what the build is doing; pip shows it with ``-v`` (it hides a build's output
    otherwise), ``python -m build`` and ``setup.py`` always."""
    print(f"monarch_nb: {message}", file=sys.stderr, flush=True)


class OptionalBuildExt(build_ext):
    """Build extensions, but report a failure instead of aborting the install."""

    # What each extension gives; without it, monarch_nb still installs and runs.
    PURPOSE = {
        "monarch_nb.native._memory": "the native data plane (RDMABuffer)",
        "monarch_nb._wire._fastwire": "signing small control messages in C "
        "(without it, the same in Python, slower)",
        "monarch_nb._wire._fastzmq": "the wire's socket operations on libzmq "
        "(without it, through pyzmq, slower)",
        "monarch_nb._wire._fastlink": "the Unix link's sends and parsing in C "
        "(without it, the same in Python, slower)",
        "monarch_nb._wire._fastpickle": "finding large bytes to send out of band in C "
        "(without it, the same in Python, slower for large containers)",
    }

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self._warn("the C extensions", exc)

    def build_extension(self, ext: Extension) -> None:
        purpose = self.PURPOSE.get(ext.name, ext.name)
        progress(f"compiling the C extension {ext.name} ({purpose})")
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(f"{ext.name} ({purpose})", exc)

    def _warn(self, what: str, exc: BaseException) -> None:
        print(
            f"warning: building {what} failed ({exc}); monarch_nb installs without it",
            file=sys.stderr,
        )


class EditableWheelWithData(editable_wheel):
    """``pip install -e .`` that also installs ``data_files`` (the built panel).

    setuptools' editable_wheel asks the distribution for ``has_data()``, which
    does not exist (it is ``has_data_files()``), so data files are silently
    left out of editable installs; install them as a regular wheel would.
    """

    def _run_install(self, category: str) -> None:
        super()._run_install(category)
        if category == "data" and self.distribution.has_data_files():
            self.run_command("install_data")  # once: distutils skips a command already run


HERE = Path(__file__).parent
LABEXTENSION_NAME = "monarch-nb"  # "name" in labextension/package.json
LABEXTENSION_SOURCE = HERE / "labextension"
LABEXTENSION_OUTPUT = HERE / "monarch_nb" / "labextension"  # "outputDir" there
LABEXTENSION_TIMEOUT_S = 600
# Commands that produce an installable tree; metadata-only runs (egg_info) build nothing.
# An sdist carries the built panel too (as data files), so a wheel built from it,
# as ``python -m build`` does, needs no Node.js.
_BUILDS = {"build", "build_py", "bdist_wheel", "editable_wheel", "develop", "install", "sdist"}


def _labextension_inputs() -> list[Path]:
    source = LABEXTENSION_SOURCE
    return [
        source / "package.json",
        source / "package-lock.json",
        source / "tsconfig.json",
        *(source / "src").rglob("*"),
        *(source / "style").rglob("*"),
    ]


def _labextension_up_to_date() -> bool:
    built = LABEXTENSION_OUTPUT / "package.json"
    if not built.exists():
        return False
    newest_input = max(p.stat().st_mtime for p in _labextension_inputs() if p.is_file())
    return built.stat().st_mtime >= newest_input


def build_labextension() -> None:
    """Build the JupyterLab panel with npm, or say why it is not built."""
    required = os.environ.get("MONARCH_NB_REQUIRE_LABEXTENSION", "") not in ("", "0")
    npm = shutil.which("npm")
    if not (LABEXTENSION_SOURCE / "package.json").exists():
        return  # a tree without the panel's sources: install what was built, if anything
    if npm is None or shutil.which("node") is None:
        if (LABEXTENSION_OUTPUT / "package.json").exists():
            outcome = "installing the one built earlier in monarch_nb/labextension/"
        else:
            outcome = "everything else works; install Node.js >= 18 and reinstall to get it"
        message = f"Node.js/npm not found: not building the JupyterLab Mesh panel; {outcome}"
        if required:
            sys.exit(f"error: {message}")
        print(f"warning: {message}", file=sys.stderr)
        return
    if _labextension_up_to_date():
        progress("the JupyterLab Mesh panel is already built (monarch_nb/labextension/)")
        return
    progress("building the JupyterLab Mesh panel with npm (about a minute the first time)")
    try:
        installed = LABEXTENSION_SOURCE / "node_modules" / ".package-lock.json"
        lockfile = LABEXTENSION_SOURCE / "package-lock.json"
        if not installed.exists() or installed.stat().st_mtime < lockfile.stat().st_mtime:
            try:
                _npm(npm, "ci", "--no-audit", "--no-fund")
            except subprocess.CalledProcessError:
                # npm ci refuses a lockfile that lacks optional packages of other
                # platforms (a registry mirror without them); install resolves the
                # same pinned versions and takes what this platform needs.
                _npm(npm, "install", "--no-audit", "--no-fund")
        _npm(npm, "run", "build")
        progress("built the JupyterLab Mesh panel into monarch_nb/labextension/")
    except (OSError, subprocess.SubprocessError) as exc:
        message = f"building the JupyterLab Mesh panel failed ({exc}); installing without it"
        if required:
            sys.exit(f"error: {message}")
        print(f"warning: {message}", file=sys.stderr)


def _npm(npm: str, *args: str) -> None:
    progress(f"npm {' '.join(args)} in labextension/")
    subprocess.run(
        [npm, *args], cwd=LABEXTENSION_SOURCE, check=True, timeout=LABEXTENSION_TIMEOUT_S
    )


def labextension_data_files() -> list[tuple[str, list[str]]]:
    """The built panel, placed where JupyterLab looks for prebuilt extensions."""
    if not (LABEXTENSION_OUTPUT / "package.json").exists():
        return []
    target = Path("share", "jupyter", "labextensions", LABEXTENSION_NAME)
    by_folder: dict[str, list[str]] = {}
    for path in sorted(LABEXTENSION_OUTPUT.rglob("*")):
        if path.is_file():
            folder = target / path.parent.relative_to(LABEXTENSION_OUTPUT)
            by_folder.setdefault(str(folder), []).append(str(path.relative_to(HERE)))
    by_folder[str(target)].append(str((LABEXTENSION_SOURCE / "install.json").relative_to(HERE)))
    return sorted(by_folder.items())


if _BUILDS & set(sys.argv[1:]):
    build_labextension()

# Only PyInit_* is exported: the shared SHA-256 (and every other helper) cannot be
# interposed by another library's symbols.
C_FLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]

setup(
    data_files=labextension_data_files(),
    ext_modules=[
        Extension(
            "monarch_nb.native._memory",
            # _cuda.c opens the CUDA runtime at run time (dlopen): no CUDA to build.
            sources=[
                "monarch_nb/native/_memory.c",
                "monarch_nb/native/_memory_protocol.c",
                "monarch_nb/native/_memory_registry.c",
                "monarch_nb/native/_memory_server.c",
                "monarch_nb/native/_memory_client.c",
                "monarch_nb/native/_memory_lease.c",
                "monarch_nb/native/_cuda.c",
                "monarch_nb/_wire/_sha256.c",
                "monarch_nb/native/_seal.c",
            ],
            depends=[
                "monarch_nb/native/_memory.h",
                "monarch_nb/native/_cuda.h",
                "monarch_nb/_wire/_sha256.h",
                "monarch_nb/native/_seal.h",
            ],
            extra_compile_args=C_FLAGS,
            extra_link_args=["-pthread", "-ldl"],
            optional=True,
        ),
        Extension(
            "monarch_nb._wire._fastwire",
            # Signing and checking small control messages; _signed.py falls back to
            # hashlib (same bytes on the wire) when it is missing.
            sources=["monarch_nb/_wire/_fastwire.c", "monarch_nb/_wire/_sha256.c"],
            depends=["monarch_nb/_wire/_sha256.h", "monarch_nb/_wire/_link_send.h"],
            extra_compile_args=C_FLAGS,
            optional=True,
        ),
        Extension(
            "monarch_nb._wire._fastzmq",
            # The wire's per-message socket operations on the libzmq pyzmq loaded
            # (dlopen at run time: no libzmq headers to build); pyzmq without it.
            sources=["monarch_nb/_wire/_fastzmq.c"],
            extra_compile_args=C_FLAGS,
            extra_link_args=["-ldl"],
            optional=True,
        ),
        Extension(
            "monarch_nb._wire._fastlink",
            # The Unix link's sends and parsing (the local workers' link); the same in
            # Python without it.
            sources=["monarch_nb/_wire/_fastlink.c"],
            depends=["monarch_nb/_wire/_link_send.h"],
            extra_compile_args=C_FLAGS,
            optional=True,
        ),
        Extension(
            "monarch_nb._wire._fastpickle",
            # What _serialize.dumps looks for before pickling (large bytes to send
            # out of band); the same look in Python without it.
            sources=["monarch_nb/_wire/_fastpickle.c"],
            extra_compile_args=C_FLAGS,
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt, "editable_wheel": EditableWheelWithData},
)
