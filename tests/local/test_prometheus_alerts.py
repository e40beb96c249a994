"""The local Prometheus of ``llmfleet up``: it scrapes every part of the fleet, the engines with their pool label.

The fleet is `faulty_fleet` (its engine fails half the requests; the alert rules page on it).
"""

from __future__ import annotations

import re
import shutil
from typing import Any

import httpx
import pytest

from fleet.local.prometheus import POOL_LABEL
from tests.local.conftest import Fleet

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus on PATH"),
]


def prometheus_url(fleet: Fleet) -> str:
    match = re.search(r"prometheus\s+(http://127\.0\.0\.1:\d+)", fleet.output[0])
    assert match, f"no Prometheus address in the banner:\n{fleet.output[0]}"
    return match.group(1)


JOBS = {"gateway", "control-plane", "engine", "agent"}


async def test_every_part_is_scraped_and_engines_carry_their_pool_label(faulty_fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=prometheus_url(faulty_fleet), timeout=3) as prom:

        async def all_up() -> list[dict[str, Any]] | None:
            targets: list[dict[str, Any]] = (await prom.get("/api/v1/targets")).json()["data"]["activeTargets"]
            return targets if JOBS <= {t["labels"]["job"] for t in targets if t["health"] == "up"} else None

        targets = await faulty_fleet.until(all_up, timeout_s=30, what=f"a healthy target in each of {sorted(JOBS)}")
    engines = [t for t in targets if t["labels"]["job"] == "engine"]
    assert {e["labels"][POOL_LABEL] for e in engines} == {"qwen-7b"}
