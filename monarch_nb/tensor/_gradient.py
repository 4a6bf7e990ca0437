"""``grad_generator`` and ``grad_function``, as Monarch's ``monarch.gradient_generator``.

``grad_generator(loss, params)`` yields each parameter's gradient as soon as the
backward pass has computed it, and computes the rest only as the caller asks
for more: ops issued between two ``next()`` (a gradient's all-reduce) reach the
ranks between the backward ops, so reduction overlaps the rest of backward, as
in DDP. Backward runs on a helper thread that hands over to the caller at each
gradient (never both at once), so ops still reach the ranks in one order.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .._model._errors import MeshUsageError
from .._model._public import publish


class _Handoff:
    """Two parties taking turns: the backward thread and the caller."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.turn = "caller"

    def give(self, to: str) -> None:
        with self.cond:
            self.turn = to
            self.cond.notify_all()

    def wait_for(self, who: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == who)


def grad_generator(
    roots: torch.Tensor | Sequence[torch.Tensor] = (),
    with_respect_to: Sequence[torch.Tensor] = (),
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> Iterator[torch.Tensor | None]:
    """The gradients of ``roots`` with respect to each of ``with_respect_to``, one at a
    time, in that order (pass parameters last layer first, the order backward reaches
    them). Like ``torch.autograd.grad``: nothing accumulates into ``.grad``; a tensor
    that ``roots`` does not depend on gets None.

    ::

        params = list(reversed(list(model.parameters())))
        for p, g in zip(params, grad_generator(loss, params)):
            g.reduce_("dp", "avg")        # issued while backward continues
            with torch.no_grad():
                p -= lr * g
    """
    roots = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    wrt = list(with_respect_to)
    if not roots or not wrt:
        raise MeshUsageError("grad_generator() needs roots and with_respect_to tensors")
    grads = list(grad_roots) or [None] * len(roots)
    return _generate(roots, wrt, grads)


def _generate(
    roots: list[torch.Tensor], wrt: list[torch.Tensor], grad_roots: list[Any]
) -> Iterator[torch.Tensor | None]:
    handoff = _Handoff()
    ready: dict[int, torch.Tensor] = {}
    outcome: dict[str, Any] = {}
    index = {id(t): i for i, t in enumerate(wrt)}

    def on_grad(i: int, grad: torch.Tensor) -> None:
        ready[i] = grad
        handoff.give("caller")
        handoff.wait_for("backward")

    def backward() -> None:
        handoff.wait_for("backward")
        try:
            outcome["grads"] = torch.autograd.grad(
                roots, wrt, grad_roots, allow_unused=True, retain_graph=False
            )
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            for handle in handles:
                handle.remove()
            outcome["done"] = True
            handoff.give("caller")

    handles = [
        t.register_hook(functools.partial(_pass_through, on_grad, index[id(t)])) for t in wrt
    ]
    thread = threading.Thread(target=backward, name="monarch_nb-grad-generator", daemon=True)
    thread.start()
    try:
        for i in range(len(wrt)):
            while i not in ready and "done" not in outcome:
                handoff.give("backward")
                handoff.wait_for("caller")
            if "error" in outcome:
                raise outcome["error"]
            yield ready.pop(i) if i in ready else outcome["grads"][i]
    finally:
        while "done" not in outcome:  # an abandoned generator: let backward finish
            handoff.give("backward")
            handoff.wait_for("caller")
        thread.join()


def _pass_through(on_grad: Callable[[int, Any], None], i: int, grad: Any) -> None:
    on_grad(i, grad)


class _GradFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fn: Callable[..., Any], *args: Any) -> Any:
        result, ctx.backward_continuation = fn(*args)
        return result

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        output = ctx.backward_continuation(*grads)
        return (None, *output) if isinstance(output, tuple) else (None, output)


def grad_function(fn: Callable[..., tuple[Any, Callable[..., Any]]]) -> Callable[..., Any]:
    """A differentiable function from a forward that returns ``(result, backward)``:
    ``backward(grad_result)`` returns the gradients of the inputs (a tuple for several),
    as Monarch's ``grad_function``. Useful for ops autograd cannot see through, e.g.
    collectives::

        @grad_function
        def all_reduce(x):
            return x.reduce("dp", "sum"), lambda g: g.reduce("dp", "sum")
    """
    return functools.partial(_GradFunction.apply, fn)


publish(globals())
