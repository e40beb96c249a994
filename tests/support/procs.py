"""Procs: start ``llmfleet`` processes, wait until they serve, talk to them over HTTP, and leave none behind.

Built on `llmfleet.local.procs.Child` (``python -m llmfleet.cli ARGV`` in its own session, output to a log file), the
harness ``llmfleet up`` uses for its own components. Every wait has a deadline, fails at once when the process
exits, and puts the end of the process's log in its failure message.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

import httpx

from llmfleet.local.procs import Child
from tests.support.wait import wait_for

__all__ = ["Proc", "Procs"]

_URL = re.compile(r"https?://127\.0\.0\.1:\d+")
_LOG_LINES = 60  # how much of a log a failure message shows


class Proc:
    """One ``llmfleet <argv>`` process and where it serves.

    ``url`` is known from the start (a port the test chose) or read from the log (`wait_url`). ``extra_pids`` are
    processes it started in sessions of their own (an agent's engines): `stop` and `kill` end their groups too.
    """

    def __init__(self, child: Child, url: str | None = None) -> None:
        self.child = child
        self._url = url
        self.extra_pids: set[int] = set()

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        log: Path,
        *,
        name: str | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Self:
        """Spawn ``llmfleet <argv>`` with its output in ``log`` (``env`` added to this process's environment);
        returns at once (see the ``wait_*`` methods)."""
        return cls(Child(name or argv[0], list(argv), log, env=env), url)

    @property
    def name(self) -> str:
        return self.child.name

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.child.process

    @property
    def log(self) -> Path:
        return self.child.log

    @property
    def url(self) -> str:
        if self._url is None:
            raise AssertionError(f"{self.name}: no URL yet (wait_url first)")
        return self._url

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None, self.url
        return port

    # -- HTTP

    def get(self, path: str, timeout: float = 3.0, **kwargs: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=timeout, trust_env=False, **kwargs)

    def post(self, path: str, timeout: float = 3.0, **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=timeout, trust_env=False, **kwargs)

    # -- the log

    def text(self) -> str:
        """The whole log so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = _LOG_LINES) -> str:
        return self.child.tail(lines)

    # -- waiting

    def wait_log(self, text: str, *, timeout_s: float = 30.0, diagnostics: Callable[[], str] | None = None) -> str:
        """Wait until ``text`` is in the log; returns the whole log at that point."""

        def logged() -> str | None:
            log = self.text()
            if text in log:
                return log
            self._fail_if_exited()
            return None

        return wait_for(
            logged, timeout_s=timeout_s, what=f"{text!r} in {self.name}'s log", diagnostics=diagnostics or self.tail
        )

    def wait_url(self, marker: str, *, timeout_s: float = 30.0) -> str:
        """Wait for ``marker`` and a loopback URL after it in the log (a process bound to port 0); that is `url`."""

        def found() -> str | None:
            log = self.text()
            if marker in log:
                match = _URL.search(log, log.index(marker))
                if match:
                    return match.group(0)
            self._fail_if_exited()
            return None

        self._url = wait_for(
            found, timeout_s=timeout_s, what=f"{self.name} to log {marker!r} and its URL", diagnostics=self.tail
        )
        return self._url

    def logged_url(self, marker: str) -> str:
        """The loopback URL logged after ``marker``, already in the log (a second listener's); `url` is unchanged."""
        log = self.text()
        match = _URL.search(log, log.index(marker)) if marker in log else None
        if match is None:
            raise AssertionError(f"{self.name} logged no URL after {marker!r}:\n{self.tail()}")
        return match.group(0)

    def wait_http(
        self, path: str, *, timeout_s: float = 30.0, ok: tuple[int, ...] = (200,), interval_s: float = 0.05
    ) -> float:
        """Wait until ``GET path`` answers one of ``ok``; returns the monotonic time it first did."""

        def answered() -> float | None:
            self._fail_if_exited()
            return time.monotonic() if self.get(path, timeout=1.0).status_code in ok else None

        return wait_for(
            answered,
            timeout_s=timeout_s,
            interval_s=interval_s,
            what=f"{self.name} {path} -> {ok}",
            diagnostics=self.tail,
        )

    def _fail_if_exited(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited with {code}:\n{self.tail()}")

    # -- signals and the end

    def send(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """Its exit status, waiting up to ``timeout_s`` (subprocess.TimeoutExpired past that)."""
        return self.process.wait(timeout_s)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (it drains), wait up to ``timeout_s``, then SIGKILL what is left of its group and `extra_pids`."""
        code = self.child.stop(timeout_s)
        self._kill_groups({self.process.pid, *self.extra_pids})
        return code

    def kill(self) -> int | None:
        """SIGKILL its group and `extra_pids`' at once."""
        code = self.child.kill()
        self._kill_groups(self.extra_pids)
        return code

    @staticmethod
    def _kill_groups(pids: set[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


P = TypeVar("P", bound=Proc)


class Procs:
    """The processes a test started, with their logs in ``folder``. `close` ends them newest first: each with a
    drain-aware `Proc.stop` when it was started with ``stop_timeout_s``, else with `Proc.kill`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[tuple[Proc, float | None]] = []

    def start(
        self,
        argv: Sequence[str],
        *,
        name: str,
        url: str | None = None,
        log: Path | None = None,
        stop_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        proc = Proc.start(argv, log or self.folder / f"{name}.log", name=name, url=url, env=env)
        return self.add(proc, stop_timeout_s=stop_timeout_s)

    def add(self, proc: P, *, stop_timeout_s: float | None = None) -> P:
        self.started.append((proc, stop_timeout_s))
        return proc

    def close(self) -> None:
        """End every process, even when ending one fails; then raise the first failure."""
        failures: list[Exception] = []
        for proc, stop_timeout_s in reversed(self.started):
            try:
                if stop_timeout_s is None:
                    proc.kill()
                else:
                    proc.stop(stop_timeout_s)
            except Exception as exc:  # the others must still be ended
                failures.append(exc)
        if failures:
            raise failures[0]
