"""``llmfleet up`` failing to start: a clear message, exit status 1, and no process left behind."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from fleet.protocol.ports import free_port
from tests.llmfleet.local.conftest import fast_stack


def test_a_busy_control_plane_port_fails_fast_and_cleanly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmfleet.cli",
                "up",
                "--stack",
                str(fast_stack(tmp_path)),
                "--port",
                str(free_port()),
                "--control-plane-port",
                str(port),
                "--log-dir",
                str(tmp_path / "logs"),
                "--ready-timeout",
                "20",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert "the control plane did not start" in done.stderr and "address already in use" in done.stderr.lower()


def test_an_unknown_stack_is_a_spec_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmfleet.cli", "up", "--stack", "nope"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "no stack 'nope'" in done.stderr
