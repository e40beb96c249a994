"""Fixtures every test folder shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """The ``llmfleet`` processes a test starts, their logs in its tmp_path; all ended when it ends."""
    started = Procs(tmp_path)
    yield started
    started.close()
