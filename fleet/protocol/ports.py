"""Ports: choose a free TCP port for a process that will bind it a moment later.

A port chosen by binding port 0 lies in the OS's ephemeral range, and between the choice and the later bind the
kernel may hand the same number to any other process binding port 0 (every engine, client socket and test
server on a busy machine does). Ports chosen *below* the ephemeral range are never handed out that way, which
closes that race; the choice still checks that the port binds now.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port that binds on ``host`` now, below the ephemeral range; an OS-chosen one if none does."""
    rng = rng or random.Random()
    low, _ = _ephemeral_range()
    for _ in range(50):
        port = rng.randrange(max(1024, low - 12000), max(1025, low - 1))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
