"""Fixtures for quota tests: a redis-server of the test's own, to kill and restart on the same port."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.protocol.ports import free_port
from tests.support.wait import wait_for


class RedisServer:
    """One redis-server on a fixed loopback port; `kill` (SIGKILL) and `start` again on the same port.

    It saves only on demand (``SAVE``): a restart loads what was last saved, else starts empty.
    """

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [*argv, "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(self._accepting, timeout_s=10, what=f"redis-server on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no save; connections break at once."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def _accepting(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"redis-server on port {self.port} exited with {self.process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
            return True
        return False


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A started `RedisServer` of this test's own (skips without a redis-server binary); killed at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH (apt-get install redis-server)")
    server = RedisServer(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()
