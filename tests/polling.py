"""Waiting for something to become true, with a deadline (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def read_until(read: Callable[[], T], done: Callable[[T], bool], timeout: float, what: str) -> T:
    """``read()`` again until ``done`` holds of its value (returned), failing after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it is truthy (returned), failing after ``timeout`` s."""
    return read_until(predicate, bool, timeout, what)
