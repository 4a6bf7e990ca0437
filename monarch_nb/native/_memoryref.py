"""Find the raw memory behind a tensor, an ndarray or a Python buffer.

Only memory that is contiguous qualifies (CPU memory, or a CUDA tensor): the
data plane copies one flat byte range. Everything that does not qualify is refused here,
with a message that says how to make it qualify. torch and numpy are never
imported by this module; an object can only be a tensor if torch is loaded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoryRef:
    """One contiguous byte range and what it holds.

    ``dtype`` is None for untyped bytes (bytearray, memoryview, bytes), which
    may be copied to or from memory of any dtype. ``keepalive`` holds the
    object (or a memoryview pinning it) for as long as the range is in use.
    ``device`` is the CUDA device index of a CUDA tensor's memory, -1 for host
    memory.
    """

    address: int
    nbytes: int
    dtype: str | None
    shape: tuple[int, ...]
    writable: bool
    kind: str
    keepalive: Any
    device: int = -1


def describe(obj: Any, role: str, *, need_writable: bool) -> MemoryRef:
    """Return the memory of ``obj``, or raise TypeError/ValueError naming ``role``.

    ``role`` is how errors call the object ("the registered object", "the
    destination", "the source").
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _describe_tensor(obj, role, need_writable)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        return _describe_ndarray(obj, role, need_writable)
    return _describe_buffer(obj, role, need_writable)


def _describe_tensor(t: Any, role: str, need_writable: bool) -> MemoryRef:
    device = t.device
    if device.type == "meta":
        raise ValueError(
            f"{role} is a tensor on device 'meta', which holds only a shape and a dtype and "
            "has no memory to copy; create it on the CPU (device='cpu')"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"RDMABuffer supports CPU and CUDA memory; {role} is a tensor on "
            f"device {str(device)!r}; move it with .cpu() first"
        )
    if t.layout != sys.modules["torch"].strided:
        raise ValueError(f"{role} has layout {t.layout}; only dense tensors can be copied")
    if not t.is_contiguous():
        raise ValueError(
            f"{role} is not contiguous (shape {tuple(t.shape)}, stride {t.stride()}); "
            "call .contiguous() first"
        )
    if t.is_conj() or t.is_neg():
        raise ValueError(f"{role} has a lazy conjugate/negative view; call .resolve_conj() first")
    return MemoryRef(
        address=t.data_ptr(),
        nbytes=t.numel() * t.element_size(),
        dtype=_tensor_dtype(t),
        shape=tuple(t.shape),
        writable=True,
        kind="tensor" if device.type == "cpu" else f"tensor on {device}",
        keepalive=t,
        device=-1 if device.type == "cpu" else int(device.index or 0),
    )


def _tensor_dtype(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _describe_ndarray(a: Any, role: str, need_writable: bool) -> MemoryRef:
    if not a.flags.c_contiguous:
        raise ValueError(
            f"{role} is not C-contiguous (shape {a.shape}, strides {a.strides}); "
            "call numpy.ascontiguousarray() first"
        )
    if a.dtype.hasobject:
        raise TypeError(
            f"{role} holds Python objects (dtype {a.dtype}); only raw data can be copied"
        )
    if need_writable and not a.flags.writeable:
        raise ValueError(f"{role} is a read-only numpy array; pass a writable one")
    dtype = a.dtype.name if a.dtype.isnative else a.dtype.str
    return MemoryRef(
        address=a.__array_interface__["data"][0],
        nbytes=a.nbytes,
        dtype=dtype,
        shape=tuple(a.shape),
        writable=bool(a.flags.writeable),
        kind="ndarray",
        keepalive=a,
    )


def _describe_buffer(obj: Any, role: str, need_writable: bool) -> MemoryRef:
    from monarch_nb.native._loader import load_extension

    memory = load_extension()
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{role} must be a contiguous CPU torch.Tensor, numpy.ndarray, bytearray or "
            f"writable memoryview; got {type(obj).__name__!r}"
        ) from None
    if not view.c_contiguous:
        raise ValueError(f"{role} is a non-contiguous memoryview; copy it with bytes() first")
    if need_writable and view.readonly:
        raise ValueError(
            f"{role} is read-only ({type(obj).__name__}); pass a bytearray or writable memoryview"
        )
    address, nbytes = memory.address_of(view, not view.readonly)
    return MemoryRef(
        address=address,
        nbytes=nbytes,
        dtype=None,
        shape=(nbytes,),
        writable=not view.readonly,
        kind=type(obj).__name__,
        # The memoryview pins the exporter: a bytearray cannot be resized under it.
        keepalive=view,
    )
