"""Fixtures every test folder shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from fleet.protocol.ports import free_port
from tests.support.procs import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """The ``llmfleet`` processes a test starts, their logs in its tmp_path; all ended when it ends."""
    started = Procs(tmp_path)
    yield started
    started.close()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's server on a free loopback port, one per test module (its state lives as long as the module's tests):
    boto3 clients reach it with ``endpoint_url``, as they would reach AWS."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
