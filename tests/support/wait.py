"""Wait: poll a condition until it holds, or fail at a deadline saying what was awaited and what was seen."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Required, TypedDict, TypeVar, Unpack, cast

import httpx

__all__ = ["WaitOptions", "async_wait_for", "wait_for"]

T = TypeVar("T")


class WaitOptions(TypedDict, total=False):
    """How `wait_for` and `async_wait_for` wait."""

    timeout_s: Required[float]
    what: Required[str]  # what is awaited, for the failure message
    interval_s: float  # the pause between two calls of the predicate (default 0.05 s)
    diagnostics: Callable[[], str] | None  # appended to the failure message (a log tail, say)
    ignore: tuple[type[Exception], ...]  # exceptions that mean "not yet" (default: httpx.HTTPError)


class _Deadline:
    def __init__(self, options: WaitOptions) -> None:
        self.options = options
        self.at = time.monotonic() + options["timeout_s"]
        self.interval_s = options.get("interval_s", 0.05)
        self.ignore = options.get("ignore", (httpx.HTTPError,))

    def check(self) -> None:
        """AssertionError naming what was awaited, once the deadline has passed."""
        if time.monotonic() < self.at:
            return
        message = f"timed out after {self.options['timeout_s']} s waiting for {self.options['what']}"
        diagnostics = self.options.get("diagnostics")
        raise AssertionError(f"{message}\n{diagnostics()}" if diagnostics is not None else message)


def wait_for(predicate: Callable[[], T | None], **options: Unpack[WaitOptions]) -> T:
    """Call ``predicate`` every ``interval_s`` until it returns a truthy value; return that value.

    An exception in ``ignore`` counts as "not yet" (by default ``httpx.HTTPError``: a server still starting, or
    restarting); any other propagates at once, so a predicate can fail fast (a process that exited). Past
    ``timeout_s``: AssertionError naming ``what``, followed by ``diagnostics()``.
    """
    deadline = _Deadline(options)
    while True:
        with contextlib.suppress(*deadline.ignore):
            value = predicate()
            if value:
                return value
        deadline.check()
        time.sleep(deadline.interval_s)


async def async_wait_for(predicate: Callable[[], Awaitable[T | None] | T | None], **options: Unpack[WaitOptions]) -> T:
    """`wait_for` inside an event loop: ``predicate`` may be async, and the pauses let the loop run."""
    deadline = _Deadline(options)
    while True:
        with contextlib.suppress(*deadline.ignore):
            result = predicate()
            value = await result if inspect.isawaitable(result) else result
            if value:
                return cast(T, value)
        deadline.check()
        await asyncio.sleep(deadline.interval_s)
