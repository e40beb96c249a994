"""``llmfleet control-plane`` as a real process: serves, decides, and in dry-run launches nothing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fleet.local.procs import descendants
from fleet.ports import free_port


def test_dry_run_control_plane_logs_decisions_and_starts_no_agent() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "control-plane", "--stack", "local", "--port", str(port), "--dry-run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        decisions: list[dict[str, object]] = []
        while time.monotonic() < deadline and not decisions:
            try:
                decisions = httpx.get(f"http://127.0.0.1:{port}/v1/decisions", timeout=1).json()["decisions"]
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert decisions and decisions[0]["kind"] == "scale-up"
        assert str(decisions[0]["reason"]).startswith("availability")
        assert descendants(process.pid) == set()  # dry run: nothing launched
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def test_unknown_stack_exits_2_with_the_list_of_stacks() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "control-plane", "--stack", "nope", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "local" in done.stderr


def test_port_zero_prints_the_bound_address_and_serves_on_it(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    with out.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli", "control-plane", "--stack", "local", "--port", "0", "--dry-run"],
            stdout=handle,
            stderr=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 30
        while "\n" not in out.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
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
