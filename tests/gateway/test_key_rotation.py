"""Tenant key rotation: a key removed from the mounted ``tenant-keys.json`` is refused within a bounded time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleet.protocol.keys import hash_api_key
from gateway.auth import KeyHashesFile, KeyRing
from gateway.errors import Unauthorized
from tests.gateway.builders import ManualClock
from tests.support.stacks import spec

OLD, NEW = "sk-acme-old", "sk-acme-new"


def _write(path: Path, *keys: str) -> None:
    """Replace the table the way a Secret volume does: a new file swapped in (a new inode)."""
    fresh = path.with_suffix(".new")
    fresh.write_text(json.dumps({"gold": [hash_api_key(k) for k in keys]}))
    os.replace(fresh, path)


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "tenant-keys.json"
    _write(path, OLD)
    return path


def test_a_revoked_key_is_refused_within_the_check_interval(table: Path) -> None:
    clock = ManualClock()
    ring = KeyRing(spec("gateway").tenants, extra_hashes=KeyHashesFile(table, check_interval_s=5.0, clock=clock))
    assert ring.authenticate(f"Bearer {OLD}").name == "gold"

    _write(table, NEW)  # pulumi up rotated acme's key; the kubelet synced the Secret
    clock.now = 4.9
    assert ring.authenticate(f"Bearer {OLD}").name == "gold"  # not looked at yet: at most check_interval_s
    clock.now = 5.0
    with pytest.raises(Unauthorized):
        ring.authenticate(f"Bearer {OLD}")
    assert ring.authenticate(f"Bearer {NEW}").name == "gold"


def test_a_table_that_does_not_parse_keeps_the_last_good_keys(table: Path) -> None:
    clock = ManualClock()
    ring = KeyRing(spec("gateway").tenants, extra_hashes=KeyHashesFile(table, check_interval_s=1.0, clock=clock))
    table.write_text("{not json")
    clock.now = 2.0
    assert ring.authenticate(f"Bearer {OLD}").name == "gold"


def test_a_table_written_after_start_is_picked_up(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "tenant-keys.json"
    hashes = KeyHashesFile(path, check_interval_s=1.0, clock=clock)
    ring = KeyRing(spec("gateway").tenants, extra_hashes=hashes)
    assert dict(hashes) == {}
    with pytest.raises(Unauthorized):
        ring.authenticate(f"Bearer {NEW}")
    _write(path, NEW)
    clock.now = 1.0
    assert ring.authenticate(f"Bearer {NEW}").name == "gold"
