"""nbval runs these notebooks with rank output ordered, as their stored outputs were made,
and checks after each notebook that its kernel left no worker process behind.

Run: ``pytest notebooks/`` (pyproject.toml adds ``--nbval`` and the sanitize file).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from process_checks import leaked_since, our_workers

_before_notebook: set[int] = set()


_DETERMINISTIC = "MONARCH_NB_DETERMINISTIC"

# Notebooks that need a CUDA device: skipped (with the reason) where there is none.
_GPU_NOTEBOOKS = {"08_gpu.ipynb"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.path.name in _GPU_NOTEBOOKS]
    if not gpu_items:
        return
    import torch

    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (a GPU notebook)"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    global _before_notebook
    if item.nodeid.endswith("::Cell 0"):
        _before_notebook = set(our_workers())
        # Only the notebooks' kernels (started in this setup) run ordered; kernels
        # that tests/ starts in the same session must stream live.
        os.environ[_DETERMINISTIC] = "1"
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # nbval shuts the notebook's kernel down in here, after its last cell
    if nextitem is None or nextitem.path != item.path:
        os.environ.pop(_DETERMINISTIC, None)
        leaked = leaked_since(_before_notebook)
        if leaked:
            pytest.fail(f"{item.path.name} left worker processes behind: {sorted(leaked)}")
