"""Pickling for the wire: protocol 5 with large buffers out of band.

Tensors, numpy arrays, bytes and bytearrays above a small threshold are handed
to the wire as separate frames (``PickleBuffer``), so a 64 MiB tensor is never
copied into the pickle stream; on receipt it is rebuilt directly on the
received frame's memory.

Two picklers share one reducer: the controller uses cloudpickle (classes and
functions from ``__main__``, i.e. notebook cells, travel by value); workers use
the standard pickler and fall back to cloudpickle only when a reply needs it,
so a worker does not pay cloudpickle's import on start.
"""

from __future__ import annotations

import ctypes
import io
import linecache
import os
import pickle
import sys
import types
from collections.abc import Sequence
from typing import Any

from ._extensions import load_extension

# Below this many bytes a buffer is cheaper in-band than as its own frame.
OUT_OF_BAND_THRESHOLD = 4096


class _OutOfBand:
    """Carries a large bytes/bytearray out of band.

    The C pickler writes bytes and bytearray in-band without asking
    ``reducer_override``, so :func:`dumps` wraps large ones in this first.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def __reduce__(self) -> Any:
        rebuild = _rebuild_bytes if type(self.data) is bytes else _rebuild_bytearray
        return rebuild, (pickle.PickleBuffer(self.data),)


_CONTAINERS = (tuple, list, dict)


_WRAP_DEPTH = 3  # how deep in containers large bytes are looked for


def _wrap_large_bytes(obj: Any, depth: int = _WRAP_DEPTH) -> Any:
    """``obj`` with large bytes wrapped, looking into containers ``depth`` levels deep.

    Shallow on purpose: arguments, return values and their direct containers
    are where bulk bytes travel; deeper ones go in-band (still correct).
    This runs on every call, so it copies a container only if something in
    it was wrapped, and returns ``obj`` itself otherwise.
    """
    kind = type(obj)
    if kind is bytes or kind is bytearray:
        return _OutOfBand(obj) if len(obj) >= OUT_OF_BAND_THRESHOLD else obj
    if depth == 0 or kind not in _CONTAINERS or not obj:
        return obj
    if kind is dict:
        changed: dict[Any, Any] | None = None
        for key, value in obj.items():
            if type(value) in _SCANNED and value:  # an empty one holds nothing large
                wrapped = _wrap_large_bytes(value, depth - 1)
                if wrapped is not value:
                    changed = changed if changed is not None else dict(obj)
                    changed[key] = wrapped
        return obj if changed is None else changed
    items: list[Any] | None = None
    for i, value in enumerate(obj):
        if type(value) in _SCANNED and value:
            wrapped = _wrap_large_bytes(value, depth - 1)
            if wrapped is not value:
                items = items if items is not None else list(obj)
                items[i] = wrapped
    return obj if items is None else kind(items)


_SCANNED = {bytes, bytearray, tuple, list, dict}

# The same look in C (_fastpickle.c): whether _wrap_large_bytes would change
# anything. It scans a 1,000-item list in a few microseconds, where the
# Python loop took about 90; None where the extension is not built.
_fastpickle = load_extension("_fastpickle")
_holds_large_bytes = _fastpickle.holds_large_bytes if _fastpickle is not None else None
# Whether a value is only atoms in plain containers (_fastpickle.c says which):
# pickle.dumps then writes the same bytes as our pickler, without setting one up.
_is_plain = _fastpickle.is_plain if _fastpickle is not None else None
# The copy a received large bytes/bytearray is made by, in C: on huge pages when
# it is large (a fresh 64 MiB bytes took 16,384 page faults to fill), and
# without the GIL.
_copy_buffer = _fastpickle.copy_buffer if _fastpickle is not None else None
_PLAIN_DEPTH = 8
# Values that hold nothing: pickled as is, as a plain value is (see dumps).
_SCALARS = frozenset({type(None), bool, int, float})


def _reduce_buffers(obj: Any) -> Any:
    """Reducer for objects we send out of band; NotImplemented for everything else."""
    kind = type(obj)
    torch = sys.modules.get("torch")  # never import torch just to check a type
    if torch is not None and kind is torch.Tensor:
        return _reduce_tensor(torch, obj)
    return NotImplemented


def _reduce_tensor(torch: Any, t: Any) -> Any:
    if (
        t.device.type != "cpu"
        or t.layout != torch.strided
        or t.is_quantized
        or (t.requires_grad and not t.is_leaf)
        or type(t) is not torch.Tensor
    ):
        return NotImplemented  # torch's own pickling handles the rare cases
    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    dtype = str(t.dtype).removeprefix("torch.")
    data: Any
    if nbytes == 0:
        data = b""
    elif nbytes >= OUT_OF_BAND_THRESHOLD:
        data = pickle.PickleBuffer(_tensor_memory(flat, nbytes))
    else:
        data = bytes(_tensor_memory(flat, nbytes))
    return _rebuild_tensor, (data, dtype, tuple(t.shape), t.requires_grad)


def _tensor_memory(flat: Any, nbytes: int) -> ctypes.Array[ctypes.c_ubyte]:
    """The bytes of a contiguous CPU tensor as a buffer, without a copy.

    torch exposes a tensor's memory to the buffer protocol only through
    ``.numpy()``, and torch's CPU wheel does not install numpy; a ctypes
    array over ``data_ptr()`` is the same zero-copy view with the standard
    library alone. It holds the tensor, so the memory outlives the view.
    """
    memory = (ctypes.c_ubyte * nbytes).from_address(flat.data_ptr())
    memory._tensor = flat  # type: ignore[attr-defined]
    return memory


def _rebuild_tensor(data: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> Any:
    import torch

    torch_dtype = getattr(torch, dtype)
    view = memoryview(data)
    if view.nbytes == 0:
        t = torch.empty(shape, dtype=torch_dtype)
    else:
        if view.readonly:  # in-band bytes: small, so a copy is cheap
            view = memoryview(bytearray(view))
        t = torch.frombuffer(view, dtype=torch.uint8).view(torch_dtype).reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_bytes(data: Any) -> bytes:
    if _copy_buffer is not None:
        copied: bytes = _copy_buffer(data, False)
        return copied
    return bytes(data)


def _rebuild_bytearray(data: Any) -> bytearray:
    if _copy_buffer is not None:
        copied: bytearray = _copy_buffer(data, True)
        return copied
    return bytearray(data)


# Packages whose functions and classes go by reference without a further look:
# nobody registers them to go by value (every rank imports monarch_nb; a rank
# that receives a tensor or an array needs torch or numpy to rebuild it anyway).
_ALWAYS_BY_REFERENCE = frozenset({"monarch_nb", "torch", "numpy", "builtins"})


def _by_reference(obj: Any) -> bool:
    """Whether cloudpickle would send the function or class ``obj`` by reference:
    its module is imported and is not ``__main__``, and neither it nor a package
    above it is registered to go by value (``cloudpickle.register_pickle_by_value``).
    The fast pickler then sends it so itself; otherwise cloudpickle sends it. (A
    local function or class, which cannot be found under its name, makes the
    fast pickler raise PicklingError: cloudpickle sends that one too.)"""
    module_name = getattr(obj, "__module__", None)
    if not isinstance(module_name, str) or module_name == "__main__":
        return False
    if module_name == "__mp_main__":
        return not _mp_main_by_value()
    if module_name not in sys.modules:  # pickle would import it here to look
        return False
    if module_name.partition(".")[0] in _ALWAYS_BY_REFERENCE:
        return True
    import cloudpickle  # here: a worker imports it only if it falls back

    registered = cloudpickle.list_registry_pickle_by_value()
    name = module_name
    while True:
        if name in registered:
            return False
        parent = name.rpartition(".")[0]
        if not parent:
            return True
        name = parent


def _mp_main_by_value() -> bool:
    """Make a script's classes and functions go by value in a process that
    multiprocessing started with "spawn" (there the script is ``__mp_main__``, a
    module no worker can import, as ``__main__`` is elsewhere): a second client
    that defines its actors in its script. True once registered."""
    module = sys.modules.get("__mp_main__")
    if module is None:
        return False
    import cloudpickle

    if "__mp_main__" not in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.register_pickle_by_value(module)
    return True


class _NeedsByValue(Exception):
    """Raised by the fast pickler for what only cloudpickle can send."""


class _FastPickler(pickle.Pickler):
    """The standard C pickler, plus our buffers; refuses what must go by value.

    Functions and classes that cloudpickle would send by value (from
    ``__main__``, a notebook cell; from a module registered to go by value;
    from a module not imported here) and instances of classes from ``__main__``
    cannot be found by reference on a worker, so for those it gives up early and
    :func:`dumps` starts over with cloudpickle.
    """

    def reducer_override(self, obj: Any) -> Any:
        if self.strict:
            kind = type(obj)
            if kind is types.FunctionType or isinstance(obj, type):
                # By reference where cloudpickle would send it so (see
                # _by_reference): falling back for every one (a tensor's
                # rebuilder, a datetime's class, ValueError) cost 2.5-4x the
                # whole pickling.
                by_value = not _by_reference(obj)
            else:
                module_name = kind.__module__
                by_value = module_name == "__main__" or (
                    module_name == "__mp_main__" and _mp_main_by_value()
                )
            if by_value:
                raise _NeedsByValue
        return _reduce_buffers(obj)

    strict = False


class _GuardedPickler(_FastPickler):
    strict = True


_cloud_pickler: type | None = None


def _cloudpickler() -> type:
    global _cloud_pickler
    if _cloud_pickler is None:
        import cloudpickle

        class _CloudPickler(cloudpickle.Pickler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._shipping_source: set[int] = set()

            def reducer_override(self, obj: Any) -> Any:
                reduced = _reduce_buffers(obj)
                if reduced is not NotImplemented:
                    return reduced
                if type(obj) is types.CodeType and obj.co_filename != _ANONYMOUS_CODE:
                    # cloudpickle >= 3.1.2 sends every code object as "<dynamic-code>":
                    # keep the real file name, or pdb and tracebacks on the rank
                    # cannot show the notebook cell's lines.
                    anonymous = obj.replace(co_filename=_ANONYMOUS_CODE)
                    return _with_filename, (anonymous, obj.co_filename)
                if type(obj) is types.FunctionType and id(obj) not in self._shipping_source:
                    source = _cell_source(obj.__code__.co_filename)
                    if source is not None:
                        # Rebuilt through _with_source, which puts the cell's lines in the
                        # worker's linecache: remote tracebacks then show them.
                        self._shipping_source.add(id(obj))
                        return _with_source, (obj.__code__.co_filename, source, obj)
                return super().reducer_override(obj)

        _cloud_pickler = _CloudPickler
    return _cloud_pickler


_ANONYMOUS_CODE = "<dynamic-code>"  # the name cloudpickle gives the code it sends


def _with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    return code.replace(co_filename=filename)


def _cell_source(filename: str) -> list[str] | None:
    """The lines of a notebook cell (in linecache, not on disk), else None."""
    entry = linecache.cache.get(filename)
    if entry is None or len(entry) != 4 or os.path.exists(filename):
        return None
    return list(entry[2])


def _with_source(filename: str, lines: list[str], fn: Any) -> Any:
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return fn


def dumps(obj: Any, *, by_value: bool = True) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj``; returns the pickle bytes and its out-of-band buffers.

    Both modes try the fast standard pickler first. ``by_value=True`` (the
    controller) falls back to cloudpickle as soon as something turns up that
    cloudpickle would send by value (a function or class from ``__main__``, a
    notebook cell, or from a module registered to go by value; an instance of
    a class from ``__main__``); ``False`` (workers) falls back only if plain
    pickling fails. A plain value (atoms in plain tuples, lists and dicts, as
    ``_fastpickle.is_plain`` says) skips both: ``pickle.dumps`` writes the
    same bytes without a pickler of ours to set up.
    """
    if obj.__class__ in _SCALARS:  # most return values: no look inside to take
        return pickle.dumps(obj, protocol=5), []
    if _holds_large_bytes is None or _holds_large_bytes(obj, _WRAP_DEPTH, OUT_OF_BAND_THRESHOLD):
        obj = _wrap_large_bytes(obj)
    elif _is_plain is not None and _is_plain(obj, _PLAIN_DEPTH):
        return pickle.dumps(obj, protocol=5), []  # no buffers, nothing by value
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    fast = _GuardedPickler if by_value else _FastPickler
    try:
        fast(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
        return stream.getvalue(), buffers
    except (_NeedsByValue, pickle.PicklingError, AttributeError, TypeError):
        buffers.clear()
        stream = io.BytesIO()
    _cloudpickler()(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    return stream.getvalue(), buffers


def loads(data: Any, buffers: Sequence[Any] = ()) -> Any:
    """Inverse of :func:`dumps`; ``buffers`` are the received out-of-band frames."""
    return pickle.loads(data, buffers=buffers)
