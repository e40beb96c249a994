"""A restart window on the whole local fleet (`llmfleet up`): both replicas restart in turn under their leases
while streams run through the gateway, and no request fails.

The window opened a minute ago and a replica is due once its engine has run 9 s (``minUptimeHours`` 0.0025); at
most one replica of the pool restarts at a time (``maxUnavailable`` 1). Each restarting replica drains: it leaves
rotation, finishes what it serves, and its engine starts again before its lease is released.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.llmfleet.local.conftest import FAST, Load, running_fleet
from tests.support.stacks import write_stack

pytestmark = pytest.mark.slow


def _window_open_since_a_minute() -> dict[str, Any]:
    start = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%H:%M:%S")
    return {
        "enabled": True,
        "start": start,
        "durationMinutes": 30,
        "timezone": "UTC",
        "minUptimeHours": 0.0025,
        "maxUnavailable": 1,
    }


async def test_replicas_restart_in_turn_in_their_window_without_a_failed_request(tmp_path: Path) -> None:
    pool = {**FAST["pools"][0], "replicas": {"min": 2, "max": 2}, "restartWindow": _window_open_since_a_minute()}
    stack = write_stack(tmp_path / "Pulumi.e2e-window.yaml", "local", **{**FAST, "pools": [pool]})
    with running_fleet(stack, tmp_path / "logs", "--no-prometheus") as fleet:
        originals = sorted(r["replica"] for r in fleet.replicas())
        async with Load(fleet, rps=6, model="qwen2.5-7b-instruct", max_tokens=24) as load:
            await fleet.until_restarted(originals, timeout_s=90)
            await load.stop()
        listed = fleet.replicas()
    assert sorted(r["replica"] for r in listed if r["state"] == "ready") == originals  # restarted, not replaced
    assert load.failed == Counter(), load.failed  # drained in turn, never cut
    assert sum(load.ok.values()) > 0
