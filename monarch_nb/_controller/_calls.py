"""The one way the controller sends a call; the call's state is :mod:`.._runtime._pending`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._model._errors import RemoteError, SerializationError
from .._model._public import publish
from .._model._shape import Shape
from .._runtime._pending import CallFuture, PendingCall, ReplyStream, set_wait_hook
from .._runtime._reduced_call import FOLD_PREFIX, ReducedCall
from .._wire._messages import Message
from ._actor_failures import call_error
from ._interrupt import GRACE_S, stop_call

if TYPE_CHECKING:
    from ._group_protocol import SendingGroup

__all__ = ["CallFuture", "PendingCall", "ReplyStream", "send_call", "set_wait_hook"]


def send_call(
    group: SendingGroup,
    shape: Shape,
    message_for: Callable[[int], Message],
    payload: Any,
    *,
    actor: str,
    endpoint: str = "",
    collect: str = "mesh",
    error_class: type[RemoteError] = RemoteError,
    check: Callable[[], BaseException | None] | None = None,
    encode_error: Callable[[Exception], BaseException] | None = None,
) -> PendingCall:
    """Send one call to ``shape``'s ranks of ``group``: the only way calls go out.

    ``message_for(call_id)`` builds the message; ``check()`` may refuse the
    call first (an actor mesh that is stale or failed); ``encode_error(exc)``
    turns a pickling error into the error to raise. Never raises: a call
    that cannot be sent comes back already failed.
    """
    call: PendingCall
    if collect.startswith(FOLD_PREFIX):  # Accumulator(ep, identity, "sum"): folded on the way
        call = ReducedCall(
            group.controller.next_call_id(),
            shape,
            collect.removeprefix(FOLD_PREFIX),
            actor=actor,
            endpoint=endpoint,
            error_class=error_class,
        )
    else:
        call = PendingCall(
            group.controller.next_call_id(),
            shape,
            actor=actor,
            endpoint=endpoint,
            collect=collect,
            error_class=error_class,
        )
    call.stopper = _stop
    call.grace = GRACE_S
    refused = check() if check is not None else None
    if refused is not None:
        call.fail(call_error(group, call, refused))
        return call
    try:
        encoded = group.signer.encode(message_for(call.call_id), payload)
    except Exception as exc:
        call.fail(
            encode_error(exc)
            if encode_error is not None
            else SerializationError(f"{call.label}: cannot pickle the payload: {exc}")
        )
        return call
    group.controller.send(group, shape.ranks, encoded, call)
    return call


def _stop(future: CallFuture, why: str, grace: float) -> Any:
    return stop_call(future, why=why, grace=grace)


publish(globals())
