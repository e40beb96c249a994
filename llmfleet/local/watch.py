"""Watch: what runs beside a local fleet once it is up: its Prometheus, the live view and the live PNG.

`start_prometheus` starts the local Prometheus (`llmfleet.local.prometheus`), with a rule file when given one;
`Watch.tick`, called by ``llmfleet up`` twice a
second, keeps its replica targets current and refreshes the live view (`llmfleet.local.live`) and its PNG.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import httpx

from fleet.protocol.ports import free_port
from llmfleet.local.live import LiveView, Screen
from llmfleet.local.plots import write_timeline_png
from llmfleet.local.procs import wait_http
from llmfleet.local.prometheus import LocalPrometheus, find_prometheus

__all__ = ["Watch", "start_prometheus"]


def start_prometheus(
    args: argparse.Namespace, log_dir: Path, control_plane: str, admin: str, rules: str | None
) -> tuple[LocalPrometheus | None, str]:
    """A local Prometheus scraping the fleet and evaluating ``rules`` (a rule file's YAML), and the banner's word
    on it; a missing binary or one that does not start is no error: the fleet runs without it, the banner says why."""
    if args.no_prometheus:
        return None, "off (--no-prometheus)"
    binary = find_prometheus()
    if binary is None:
        return None, "off: no `prometheus` on PATH"
    prometheus = LocalPrometheus(binary, log_dir / "prometheus", args.prometheus_port or free_port())
    log = log_dir / "prometheus.log"
    try:
        child = prometheus.start([admin], control_plane, rules, log)
    except OSError as exc:  # a binary that cannot be run, a folder that cannot be written
        return None, f"off: it could not start ({exc})"
    if not wait_http(f"{prometheus.url}/-/ready", time.monotonic() + 30.0, alive=child):
        child.stop(timeout_s=5.0)
        return None, f"off: it did not start, see {log}"
    return prometheus, f"{prometheus.url}   (alerts: {prometheus.url}/alerts)"


class Watch:
    """What runs beside the fleet once it is up: the Prometheus targets kept current (every second), the live
    view (``--live``, every ``--live-interval``) and its PNG (``--live-png``, every ``--live-png-every``)."""

    def __init__(
        self,
        args: argparse.Namespace,
        stack: str,
        admin: str,
        control_plane: str,
        prometheus: LocalPrometheus | None,
        auth: httpx.Auth | None = None,
    ) -> None:
        self.args = args
        self.stack = stack
        self.control_plane = control_plane
        self.prometheus = prometheus
        self.client = httpx.Client(timeout=1.0, auth=auth)  # auth: the control plane's reads need a credential
        self.view = LiveView(admin, control_plane) if args.live or args.live_png else None
        self.screen = Screen(sys.stdout, sys.stdout.isatty()) if args.live else None
        self._next = {"targets": 0.0, "view": 0.0, "png": time.monotonic() + args.live_png_every}
        self._prometheus_exited = False

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _due(self, what: str, now: float, every: float) -> bool:
        if now < self._next[what]:
            return False
        self._next[what] = now + every
        return True

    def tick(self, now: float) -> None:
        child = self.prometheus.child if self.prometheus is not None else None
        if child is not None and child.process.poll() is not None and not self._prometheus_exited:
            self._prometheus_exited = True  # the fleet serves on without it
            print(f"prometheus exited ({child.process.returncode}), see {child.log}", file=sys.stderr, flush=True)
        if self.prometheus is not None and not self._prometheus_exited and self._due("targets", now, 1.0):
            self.prometheus.refresh_targets(self.client, self.control_plane)
        if self.view is None or not self._due("view", now, self.args.live_interval):
            return
        width = shutil.get_terminal_size((160, 24)).columns  # 160 wide into a log file or a pipe
        text = self.view.tick(self.client, now, clock=time.strftime("%H:%M:%S"), width=width)
        if self.screen is not None:
            self.screen.show(text)
        if (
            self.args.live_png is not None
            and self.view.timeline.intervals
            and self._due("png", now, self.args.live_png_every)
        ):
            first = self.view.timeline.intervals[0].start_s
            title = f"llmfleet up --live: stack {self.stack}, the last {now - self.view.started - first:.0f} s"
            write_timeline_png(self.args.live_png, self.view.timeline, title, rates=("answered", "ok"))
