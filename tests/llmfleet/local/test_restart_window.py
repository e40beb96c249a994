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

import httpx
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
        async with httpx.AsyncClient(base_url=fleet.control_plane, timeout=5, headers=fleet.headers) as cp:

            async def both_restarted() -> list[dict[str, Any]] | None:
                history: list[dict[str, Any]] = (await cp.get("/v1/leases")).json()["history"]
                released = {h["replica"] for h in history if h["event"] == "release"}
                return history if released >= set(originals) else None

            async with Load(fleet, rps=6, model="qwen2.5-7b-instruct", max_tokens=24) as load:
                history = await fleet.until(both_restarted, timeout_s=90, what="both replicas' planned restarts")
                await load.stop()
            listed = (await cp.get("/v1/pools/qwen-7b/replicas")).json()["replicas"]
    order = [(h["event"], h["replica"]) for h in history if h["event"] in ("grant", "release")]
    first, second = order[0][1], order[2][1]
    assert order[:4] == [("grant", first), ("release", first), ("grant", second), ("release", second)], order
    assert {first, second} == set(originals)
    assert sorted(r["replica"] for r in listed if r["state"] == "ready") == originals  # restarted, not replaced
    assert load.failed == Counter(), load.failed  # drained in turn, never cut
    assert sum(load.ok.values()) > 0
