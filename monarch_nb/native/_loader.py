"""Import the C extension once, remembering why it failed if it did."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType

from monarch_nb.native._errors import RDMAUnavailableError

_module: ModuleType | None = None
_import_error: BaseException | None = None

# The extension by its own name, not as an attribute of the package: this module
# is imported while the package's __init__ runs, and needs only the extension.
try:
    import monarch_nb.native._memory as _module
except ImportError as exc:  # no compiler at install time, wrong platform, ...
    _import_error = exc


def native_available() -> bool:
    """True if the C extension imported, so RDMABuffer can be used."""
    return _module is not None


def load_extension() -> ModuleType:
    """Return ``monarch_nb.native._memory`` or raise RDMAUnavailableError saying why."""
    if _module is None:
        raise RDMAUnavailableError(
            "the native data plane is unavailable: the C extension monarch_nb.native._memory "
            f"could not be imported ({_import_error!r}). It needs Linux and a C compiler when "
            "monarch_nb is installed; reinstall with `pip install -e .` (or run "
            "`python setup.py build_ext --inplace`) and look for the compiler error"
        )
    return _module


def mapped_libraries(name: str) -> list[str]:
    """Paths of shared libraries whose file name starts with ``name`` (``libcudart.so``)
    mapped into this process: the ones the process already uses, to open the same."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if f"/{name}" in path and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def open_first(load: Callable[[str], None], candidates: Iterable[str]) -> str | None:
    """Call ``load`` (an extension function that opens a library) on each candidate
    path until one succeeds; None on success, else why the first two failed."""
    errors = []
    for path in candidates:
        try:
            load(path)
        except OSError as exc:
            errors.append(str(exc))
            continue
        return None
    return "; ".join(errors[:2]) or "no candidate library found"
