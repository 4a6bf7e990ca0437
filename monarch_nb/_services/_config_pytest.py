"""pytest helpers that run one test under several configurations, as Monarch's.

``parametrize_config`` runs the test under every combination of the values
given (a cross product), ``parametrize_config_pointwise`` under the i-th value
of every option together. Each run's body is inside ``configured(...)``.
pytest is imported only when a helper is called.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any

from .._model._errors import MeshUsageError
from ._config import configured

_PARAM = "_config_overrides"


def _decorator(combos: list[dict[str, Any]]) -> Callable[[Callable[..., Any]], Any]:
    import pytest

    ids = ["-".join(f"{k}={v}" for k, v in combo.items()) for combo in combos]

    def decorate(fn: Callable[..., Any]) -> Any:
        signature = inspect.signature(fn)
        first = inspect.Parameter(_PARAM, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wrapped: Any  # a function that gets a __signature__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(_config_overrides: dict[str, Any], *args: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return await fn(*args, **kw)

            wrapped = run_async
        else:

            @functools.wraps(fn)
            def run(_config_overrides: dict[str, Any], *args: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return fn(*args, **kw)

            wrapped = run
        params = [first, *signature.parameters.values()]
        wrapped.__signature__ = signature.replace(parameters=params)
        return pytest.mark.parametrize(_PARAM, combos, ids=ids)(wrapped)

    return decorate


def parametrize_config(**options: Iterable[Any]) -> Callable[[Callable[..., Any]], Any]:
    """Run the test once per combination of the settings' values::

    @parametrize_config(prefix_with_rank={True, False}, force_file_log={True, False})
    def test_output(): ...      # four runs
    """
    if not options:
        raise MeshUsageError("parametrize_config(): give at least one setting and its values")
    keys = list(options)
    values = [list(options[k]) for k in keys]
    return _decorator([dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)])


def parametrize_config_pointwise(**options: Iterable[Any]) -> Callable[[Callable[..., Any]], Any]:
    """Run the test once per position: the i-th value of every setting together::

    @parametrize_config_pointwise(stop_grace=[1, 5], prefix_with_rank=[True, False])
    def test_stop(): ...        # two runs
    """
    if not options:
        raise MeshUsageError(
            "parametrize_config_pointwise(): give at least one setting and its values"
        )
    keys = list(options)
    values = [list(options[k]) for k in keys]
    lengths = {k: len(v) for k, v in zip(keys, values, strict=True)}
    if len(set(lengths.values())) != 1:
        raise MeshUsageError(
            f"parametrize_config_pointwise(): every setting needs as many values; got {lengths}"
        )
    return _decorator([dict(zip(keys, combo, strict=True)) for combo in zip(*values, strict=True)])
