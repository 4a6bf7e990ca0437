"""Give the C extension the CUDA runtime that torch loaded, when a CUDA buffer appears.

The extension is built without CUDA (so it installs everywhere); the first
CUDA tensor registered or copied here opens the very ``libcudart`` torch
uses, so both share the device's primary context and a pointer from torch is
valid in C on any thread.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType

from monarch_nb.native._errors import RDMAUnavailableError
from monarch_nb.native._loader import load_extension, mapped_libraries, open_first

_lock = threading.Lock()
_loaded = False

# Where torch's runtime is not mapped under this name (a static build), these are tried.
_RUNTIME_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def load() -> ModuleType:
    """Return the extension with its CUDA half loaded, or raise RDMAUnavailableError."""
    global _loaded
    memory = load_extension()
    with _lock:
        if _loaded:
            return memory
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            raise RDMAUnavailableError(
                "a CUDA buffer needs torch with CUDA in this process, and "
                "torch.cuda.is_available() is False here; copy to a CPU destination instead"
            )
        torch.cuda.init()  # maps the runtime library if torch loads it lazily
        why = open_first(memory.cuda_load, (*mapped_libraries("libcudart.so"), *_RUNTIME_NAMES))
        if why is None:
            _loaded = True
            return memory
        raise RDMAUnavailableError(
            "CUDA buffers need the CUDA runtime library (libcudart) that torch uses, and it "
            f"could not be opened ({why}); move the tensor to the CPU with .cpu() and "
            "register that"
        )


def reader_uses_cuda() -> bool:
    """True if this process already made a CUDA context (so CUDA IPC costs no new one)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def current_device() -> int:
    """The device this process's CUDA work goes to (where IPC mappings are made)."""
    return int(sys.modules["torch"].cuda.current_device())
