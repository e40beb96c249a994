"""Procs: start, watch and stop the local fleet's processes, leaving none behind.

Each component runs in its own session (process group), so Ctrl-C in the terminal reaches only ``llmfleet up``,
which then stops the parts in order. `descendants` lists a process tree (``/proc``, or ``ps`` where there is
no ``/proc``) so a last sweep can kill anything a crashed component left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

__all__ = ["Child", "descendants", "kill_tree", "wait_http"]


def _parents() -> dict[int, int]:
    """pid -> parent pid for every process we can see."""
    out: dict[int, int] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may contain spaces and parentheses, so split after the last ')'.
            fields = stat[stat.rfind(")") + 2 :].split()
            out[int(entry.name)] = int(fields[1])
        return out
    listing = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        pid, ppid = line.split()
        out[int(pid)] = int(ppid)
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    parents = _parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier and child not in found}
        found |= frontier
    return found


def kill_tree(pids: set[int], sig: signal.Signals = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_http(url: str, deadline: float, ok: tuple[int, ...] = (200,), alive: Child | None = None) -> bool:
    """Poll ``url`` until it answers one of ``ok`` (True) or ``deadline`` (monotonic) passes or ``alive`` exits."""
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if alive is not None and alive.process.poll() is not None:
                return False
            try:
                if client.get(url).status_code in ok:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    return False


class Child:
    """One component process: ``python -m llmfleet.cli <argv>`` (or ``program <argv>``, another binary such as
    Prometheus) in its own session, output to ``log``; ``env`` is added to this process's environment (secrets go
    there, never on the command line)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        program: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*(program or (sys.executable, "-m", "llmfleet.cli")), *argv],
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM (the component drains), wait up to ``timeout_s``, then SIGKILL its whole group."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        self._out.close()
        return self.process.returncode

    def kill(self) -> int | None:
        """SIGKILL its whole group at once (no drain) and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._out.close()
        return self.process.returncode

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
