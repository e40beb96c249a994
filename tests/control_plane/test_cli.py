"""``llmfleet control-plane`` as a real process: serves, decides, and in dry-run launches nothing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from fleet.protocol.ports import free_port
from llmfleet.local.procs import descendants
from tests.support.procs import Proc
from tests.support.wait import wait_for


def test_dry_run_control_plane_logs_decisions_and_starts_no_agent(tmp_path: Path) -> None:
    port = free_port()
    argv = ["control-plane", "--stack", "local", "--port", str(port), "--dry-run", "--auth", "none"]
    cp = Proc.start(argv, tmp_path / "control-plane.log", url=f"http://127.0.0.1:{port}")
    try:
        decisions: list[dict[str, object]] = wait_for(
            lambda: cp.get("/v1/decisions", timeout=1).json()["decisions"],
            timeout_s=30,
            interval_s=0.2,
            what="a first decision",
            diagnostics=cp.tail,
        )
        assert decisions[0]["kind"] == "scale-up"
        assert str(decisions[0]["reason"]).startswith("availability")
        assert descendants(cp.process.pid) == set()  # dry run: nothing launched
        cp.send(signal.SIGTERM)
        assert cp.wait(20) == 0
    finally:
        cp.kill()


def test_unknown_stack_exits_2_with_the_list_of_stacks() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmfleet.cli", "control-plane", "--stack", "nope", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "local" in done.stderr


def test_port_zero_prints_the_bound_address_and_serves_on_it(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    with out.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmfleet.cli", "control-plane", "--stack", "local", "--port", "0", "--dry-run"]
            + ["--auth", "none"],
            stdout=handle,
            stderr=subprocess.DEVNULL,
        )
    try:
        wait_for(lambda: "\n" in out.read_text() or process.poll() is not None, timeout_s=30, what="a first line")
        line = out.read_text().split("\n")[0]
        match = re.fullmatch(r"llmfleet control-plane listening on http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        port = int(match.group(1))
        assert port != 0
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
