"""Import the C extension once, remembering why it failed if it did."""

from __future__ import annotations

from types import ModuleType

from monarch_nb.native._errors import RDMAUnavailableError

_module: ModuleType | None = None
_import_error: BaseException | None = None

try:
    from monarch_nb.native import _memory as _module
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
