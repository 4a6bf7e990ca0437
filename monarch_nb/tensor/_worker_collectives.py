"""The tensor engine's collectives on a rank: reductions and gathers along named mesh
dimensions, fused where consecutive, on a side stream where asked, each carrying
whether any rank's input had failed (so every rank learns the root cause).

A part of :class:`~._worker.TensorWorker` (a mixin over its state: ``refs``,
``meshes``, the process group), apart because it is one concern of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import DeferredError

# Up to this many elements, a reduction carries its failure flag as one more
# element (a copy); past it, the flag is a collective of its own.
_FLAG_RIDES_UP_TO = 1 << 18
# Consecutive in-place reductions are fused into one collective up to this many
# elements in all (DDP's default bucket is 25 MB; this is 16 MiB of float32).
_FUSE_UP_TO = 1 << 22


def _numel(shape: tuple) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


class Collectives:
    """``coll`` and ``sync`` ops, and fusing runs of reductions (see the module)."""

    refs: Any
    meshes: dict[int, Any]
    rank: int
    torch: Any
    dist: Any
    device: Any
    fused: int
    overlapped: int
    _error: Callable[[str, str, BaseException], DeferredError]  # TensorWorker's

    def _coll(self, out, ref, view_id, kind, dims, reduce, arg, src, layout, side=False) -> None:
        mesh = self.meshes[view_id]
        value = self.refs[ref]
        label = f"{kind}({', '.join(map(repr, dims))}{f', {reduce!r}' if reduce else ''})"
        error = value if isinstance(value, DeferredError) else None
        if side and kind == "reduce" and len(dims) == 1 and self._flag_fits(reduce, layout):
            group = mesh.get_group(dims[0])
            self._coll_async(out, ref, value, error, group, reduce, layout)
            return
        result = value
        for dim in dims:
            group = mesh.get_group(dim)
            # A rank whose input failed still takes part, so the others do not
            # hang; all then learn the root cause and store it.
            try:
                if kind != "reduce" or not self._flag_fits(reduce, layout):
                    error = self._agree_on_error(error, group)
                    if error is None:
                        result = self._collective(kind, result, group, reduce, arg, out is None)
                else:
                    result, error = self._reduce_with_flag(result, error, group, reduce, layout)
            except Exception as exc:
                error = self._error(label, src, exc)
            if error is not None:
                break
        if out is None:  # in place: the input ref now holds the result (or the error)
            if error is None and result is not value:
                value.copy_(result)
            self.refs[ref] = error if error is not None else value
        else:
            self.refs[out] = error if error is not None else result

    def _fusable_run(self, batch: list[tuple], start: int) -> list[tuple]:
        """The in-place reductions starting at ``start`` that can share one collective:
        consecutive, same view, dimensions, reduction and dtype (a loop of
        ``p.grad.reduce_("dp", "avg")``, as DDP's gradient buckets). Every rank
        sees the same batch, so every rank fuses the same way."""
        first = batch[start]
        if not self._fusable(first):
            return []
        key = (first[3], first[5], first[6], first[9][1])
        run = [first]
        total = _numel(first[9][0])
        for op in batch[start + 1 :]:
            if not self._fusable(op) or (op[3], op[5], op[6], op[9][1]) != key:
                break
            total += _numel(op[9][0])
            if total > _FUSE_UP_TO:
                break
            run.append(op)
        return run

    def _fusable(self, op: tuple) -> bool:
        return (
            op[0] == "coll"
            and not op[10]  # not on a side stream: those start one by one
            and op[1] is None  # in place
            and op[4] == "reduce"
            and self._flag_fits(op[6], (op[9][0], op[9][1]))
            and op[9][1].is_floating_point
        )

    def _coll_fused(self, ops: list[tuple]) -> None:
        """Several in-place reductions as one flat all-reduce (with the failure flag
        as its last element); each input gets its part back, or the root cause."""
        torch = self.torch
        self.fused += len(ops) - 1
        _, _, _, view_id, _, dims, reduce, _, _, (_, dtype), _ = ops[0]
        mesh = self.meshes[view_id]
        values = [self.refs[op[2]] for op in ops]
        shapes = [op[9][0] for op in ops]
        error = next((v for v in values if isinstance(v, DeferredError)), None)
        parts = [
            torch.zeros(shape, dtype=dtype, device=self.device)
            if isinstance(value, DeferredError)
            else value
            for value, shape in zip(values, shapes, strict=True)
        ]
        flat = torch.cat([part.reshape(-1) for part in parts])
        for dim in dims:
            group = mesh.get_group(dim)
            try:
                layout = (tuple(flat.shape), dtype)
                flat, error = self._reduce_with_flag(flat, error, group, reduce, layout)
            except Exception as exc:
                error = self._error(f"reduce({dim!r}, {reduce!r})", ops[0][8], exc)
            if error is not None:
                break
        if error is not None:
            for op in ops:
                self.refs[op[2]] = error
            return
        offset = 0
        for value, shape in zip(values, shapes, strict=True):
            n = _numel(shape)
            value.copy_(flat[offset : offset + n].reshape(shape))
            offset += n

    def _flag_fits(self, reduce: str, layout: tuple) -> bool:
        """Whether a failure flag can ride along as one more element of the reduction
        (one collective instead of two): small tensors of signed types, not product."""
        shape, dtype = layout
        numel = 1
        for size in shape:
            numel *= size
        signed = dtype.is_floating_point or dtype in (self.torch.int32, self.torch.int64)
        return reduce != "product" and signed and numel <= _FLAG_RIDES_UP_TO

    def _reduce_with_flag(self, t, error, group, reduce, layout) -> tuple[Any, Any]:
        return self._start_reduce(t, error, group, reduce, layout, asynchronous=False)()

    def _start_reduce(self, t, error, group, reduce, layout, *, asynchronous) -> Any:
        """Start an all-reduce of ``t`` with a failure flag as its last element; the
        returned function waits for it and gives ``(result, error)``. A synchronous
        reduction learns a failure's root cause from the rank that had it (another
        collective); an asynchronous one, finished whenever its output is read,
        names the collective only, so its ranks never disagree on collectives."""
        torch, dist = self.torch, self.dist
        shape, dtype = layout
        failed = -1 if reduce == "min" else 1  # survives this reduction
        flag = torch.tensor([0 if error is None else failed], dtype=dtype, device=self.device)
        data = torch.zeros(shape, dtype=dtype, device=self.device) if error is not None else t
        buffer = torch.cat([data.reshape(-1), flag])
        op = {"sum": "SUM", "avg": "SUM", "max": "MAX", "min": "MIN"}[reduce]
        work = dist.all_reduce(
            buffer, op=getattr(dist.ReduceOp, op), group=group, async_op=asynchronous
        )
        size = dist.get_world_size(group)

        def finish() -> tuple[Any, Any]:
            if work is not None:
                work.wait()
            if buffer[-1].item() != 0:
                if not asynchronous:
                    return None, self._gather_error(error, group)
                return None, error or self._error(
                    f"reduce({reduce!r})",
                    "",
                    RuntimeError(
                        "an input of this collective failed on another rank of its group; "
                        "read that rank's copy of the input for the root cause"
                    ),
                )
            result = buffer[:-1].reshape(shape)
            if reduce == "avg":
                result.div_(size)
            return result, None

        return finish

    def _coll_async(self, out, ref, value, error, group, reduce, layout) -> None:
        """A reduction on a side stream: started now, settled when its output is read."""
        finish = self._start_reduce(value, error, group, reduce, layout, asynchronous=True)
        self.overlapped += 1

        def settle() -> Any:
            result, failure = finish()
            if failure is not None:
                return failure
            if out is None:
                value.copy_(result)
                return value
            return result

        target = ref if out is None else out
        if out is not None:
            self.refs[out] = None
        self.refs.waiting[target] = settle

    def _sync(self, ref) -> None:
        """A borrow dropped: the side stream's work on ``ref`` completes before any op
        that follows on the stream it was borrowed from."""
        self.refs.settle(ref)

    def _agree_on_error(self, error: DeferredError | None, group: Any) -> DeferredError | None:
        torch, dist = self.torch, self.dist
        flag = torch.tensor([0 if error is None else 1], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if not flag.item():
            return None
        return self._gather_error(error, group)

    def _gather_error(self, error: DeferredError | None, group: Any) -> DeferredError:
        dist = self.dist
        errors: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(errors, error, group=group)
        return next(e for e in errors if e is not None)

    def _collective(self, kind, t, group, reduce, arg, inplace) -> Any:
        torch, dist = self.torch, self.dist
        n = dist.get_world_size(group)
        if kind == "reduce" or kind == "reduce_scatter":
            x = t if inplace else t.clone()
            ops = {"sum": "SUM", "avg": "SUM", "max": "MAX", "min": "MIN", "product": "PRODUCT"}
            dist.all_reduce(x, op=getattr(dist.ReduceOp, ops[reduce]), group=group)
            if reduce == "avg":
                x.div_(n)
            if kind == "reduce_scatter":
                x = x.chunk(n)[dist.get_rank(group)].clone()
            return x
        if kind == "all_gather":
            parts = [torch.empty_like(t) for _ in range(n)]
            dist.all_gather(parts, t.contiguous(), group=group)
            return torch.stack(parts)
        if kind == "broadcast":
            x = t if inplace else t.clone()
            dist.broadcast(x, src=dist.get_global_rank(group, arg), group=group)
            return x
        raise ValueError(f"unknown collective {kind!r}")
