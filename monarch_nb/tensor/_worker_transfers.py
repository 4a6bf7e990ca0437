"""Moving a rank's tensors to another mesh's ranks over the data plane: the
sender offers a registered buffer (one, read by each receiver), the receiver
reads it and says so; the offer travels through the process group's store.

A part of :class:`~._worker.TensorWorker` (a mixin over its state), apart
because it is one concern of its own.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from ._errors import DeferredError

# How long a receiving rank waits for the sender's handle (the sender may be
# busy with earlier work: stages of a pipeline run at their own pace).
TRANSFER_TIMEOUT_S = 600.0


class _Failed(Exception):
    def __init__(self, error: DeferredError) -> None:
        self.error = error


class Transfers:
    """``send`` and ``recv`` ops (see the module)."""

    refs: Any
    rank: int
    torch: Any
    device: Any
    store: Any
    pinned: dict[str, Any]
    _error: Callable[[str, str, BaseException], DeferredError]  # TensorWorker's

    def _send(self, xid, ref, pairs, src) -> None:
        """Offer this rank's tensor to the ranks ``pairs`` maps it to (one or several,
        as a broadcast from a slice): one registered buffer, read by each of them."""
        from ..native import RDMABuffer

        readers = [f"{xid}/{dst}" for s, dst in pairs if s == self.rank]
        if not readers:
            return
        value = self.refs[ref]
        try:
            if isinstance(value, DeferredError):
                raise _Failed(value)
            tensor = value.detach().contiguous()
            if tensor.device.type != "cpu":
                tensor = tensor.cpu()  # CUDA IPC is not wired into the engine yet
            buffer = RDMABuffer(tensor)
            self.pinned[f"{xid}/from{self.rank}"] = (buffer, tensor, readers)
            offer = pickle.dumps(("ok", buffer))
        except _Failed as failed:
            offer = pickle.dumps(("err", failed.error))
        except Exception as exc:
            offer = pickle.dumps(("err", self._error("to_mesh", src, exc)))
        for key in readers:
            self.store.set(key, offer)

    def _recv(self, out, xid, shape, dtype, src) -> None:
        from datetime import timedelta

        key = f"{xid}/{self.rank}"
        try:
            self.store.wait([key], timedelta(seconds=TRANSFER_TIMEOUT_S))
        except Exception as exc:
            self.refs[out] = self._error("to_mesh", src, exc)
            return
        status, payload = pickle.loads(self.store.get(key))
        if status == "err":
            self.refs[out] = payload
            self.store.delete_key(key)
            return
        try:
            tensor = self.torch.empty(shape, dtype=dtype)
            payload.read_into(tensor).get()
            self.refs[out] = tensor.to(self.device)
        except Exception as exc:
            self.refs[out] = self._error("to_mesh", src, exc)
        finally:
            self.store.set(f"{key}/done", b"1")
            self.store.delete_key(key)

    def _release_read_buffers(self) -> None:
        for name, (buffer, _, readers) in list(self.pinned.items()):
            done = [f"{key}/done" for key in readers]
            if self.store.check(done):
                del self.pinned[name]
                buffer.drop()
                for key in done:
                    self.store.delete_key(key)
