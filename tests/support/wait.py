"""Wait: poll a condition until it holds, or fail at a deadline saying what was awaited and what was seen."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import httpx

__all__ = ["async_wait_for", "wait_for"]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """Call ``predicate`` every ``interval_s`` until it returns a truthy value; return that value.

    An ``httpx.HTTPError`` from ``predicate`` counts as "not yet" (a server still starting, or restarting); any
    other exception propagates at once, so a predicate can fail fast (a process that exited). Past ``timeout_s``:
    AssertionError naming ``what``, followed by ``diagnostics()`` (a log tail, say).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            value = predicate()
            if value:
                return value
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(timeout_s, what, diagnostics))
        time.sleep(interval_s)


async def async_wait_for(
    predicate: Callable[[], Awaitable[T] | T],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """`wait_for` inside an event loop: ``predicate`` may be async, and the pauses let the loop run."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return cast(T, value)
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(timeout_s, what, diagnostics))
        await asyncio.sleep(interval_s)


def _timed_out(timeout_s: float, what: str, diagnostics: Callable[[], str] | None) -> str:
    message = f"timed out after {timeout_s} s waiting for {what}"
    return f"{message}\n{diagnostics()}" if diagnostics is not None else message
