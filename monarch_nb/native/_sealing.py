"""Give the C extension OpenSSL's libcrypto, for sealed (encrypted) copies.

Python's ``hashlib`` links libcrypto on nearly every build; the extension opens
that same library with ``dlopen`` (so it builds without OpenSSL's headers) and
uses its AES-256-GCM. Nothing of the cipher is ours.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

from monarch_nb.native._errors import RDMAUnavailableError
from monarch_nb.native._loader import load_extension, mapped_libraries, open_first

ENV_ENCRYPT = "MONARCH_NB_RDMA_ENCRYPT"

_lock = threading.Lock()
_loaded = False
_why_not = ""

_LIBRARY_NAMES = ("libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so")


def wanted(explicit: bool | None = None) -> bool:
    """``explicit`` if given, else ``MONARCH_NB_RDMA_ENCRYPT`` (1/true/yes)."""
    if explicit is not None:
        return explicit
    return os.environ.get(ENV_ENCRYPT, "").strip().lower() in ("1", "true", "yes", "on")


def available() -> bool:
    """True if sealed copies can be made here (libcrypto opened, now or before)."""
    try:
        load()
    except RDMAUnavailableError:
        return False
    return True


def load() -> ModuleType:
    """Return the extension with libcrypto loaded, or raise RDMAUnavailableError."""
    global _loaded, _why_not
    memory = load_extension()
    with _lock:
        if _loaded:
            return memory
        if not _why_not:
            why = open_first(memory.seal_load, (*_mapped_libcrypto(), *_LIBRARY_NAMES))
            if why is None:
                _loaded = True
                return memory
            _why_not = why
    raise RDMAUnavailableError(
        "sealed (encrypted) RDMA copies need OpenSSL's libcrypto, and it could not be "
        f"opened ({_why_not}); install OpenSSL (libssl3), or copy without encrypt="
    )


def _mapped_libcrypto() -> list[str]:
    """Paths of libcrypto mapped into this process (hashlib's), first."""
    try:
        import _hashlib  # noqa: F401  (maps libcrypto where Python links it)
    except ImportError:
        pass
    return mapped_libraries("libcrypto.so")
