"""The local Prometheus of ``llmfleet up``: it scrapes every part of the fleet, the engines with their pool label,
and the cluster's own alert rules page on an error burst.

The fleet is `faulty_fleet`: its engine fails half the requests. Under load the pool's 5xx share is about 50%, far
above the fast-burn threshold (14.4 x the 0.1% budget) over both the 1 h and the 5 m windows as soon as two scrapes
have seen the errors: a window longer than the data holds just takes the data there is. The rule's ``for: 2m`` is
left as the cluster has it, so the alert is *pending* within seconds and would fire two minutes later; the test
waits for pending (or firing), which proves the expressions, the labels and the scrape path end to end. A fleet
whose engine fails nothing raises no such alert (its 5xx share is 0).
"""

from __future__ import annotations

import asyncio
import re
import shutil
from typing import Any

import httpx
import pytest

from fleet.protocol.keys import DEMO_API_KEY
from llmfleet.local.load import LoadStats, run_load
from llmfleet.local.prometheus import POOL_LABEL
from tests.llmfleet.local.conftest import Fleet

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus on PATH"),
]


def prometheus_url(fleet: Fleet) -> str:
    match = re.search(r"prometheus\s+(http://127\.0\.0\.1:\d+)", fleet.output[0])
    assert match, f"no Prometheus address in the banner:\n{fleet.output[0]}"
    return match.group(1)


MODEL = "qwen2.5-7b-instruct"
FAST_BURN = "LlmfleetAvailabilityBudgetBurnFast"
JOBS = {"gateway", "control-plane", "engine", "agent"}


async def test_every_part_is_scraped_and_engines_carry_their_pool_label(faulty_fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=prometheus_url(faulty_fleet), timeout=3) as prom:

        async def all_up() -> list[dict[str, Any]] | None:
            targets: list[dict[str, Any]] = (await prom.get("/api/v1/targets")).json()["data"]["activeTargets"]
            return targets if JOBS <= {t["labels"]["job"] for t in targets if t["health"] == "up"} else None

        targets = await faulty_fleet.until(all_up, timeout_s=30, what=f"a healthy target in each of {sorted(JOBS)}")
    engines = [t for t in targets if t["labels"]["job"] == "engine"]
    assert {e["labels"][POOL_LABEL] for e in engines} == {"qwen-7b"}


async def test_an_error_burst_sets_off_the_pools_fast_burn_alert(faulty_fleet: Fleet) -> None:
    stats, stop = LoadStats(), asyncio.Event()
    load = asyncio.create_task(
        run_load(
            faulty_fleet.gateway, DEMO_API_KEY, MODEL, 5, 60, prompt_tokens=32, output_tokens=8, stats=stats, stop=stop
        )
    )
    try:
        async with httpx.AsyncClient(base_url=prometheus_url(faulty_fleet), timeout=3) as prom:

            async def burning() -> dict[str, Any] | None:
                if not stats.errors:  # the burst is under way (the fleet may have failed requests before)
                    return None
                alerts = (await prom.get("/api/v1/alerts")).json()["data"]["alerts"]
                found = [a for a in alerts if a["labels"]["alertname"] == FAST_BURN]
                return found[0] if found else None

            alert = await faulty_fleet.until(burning, timeout_s=60, what=f"{FAST_BURN} pending or firing")
    finally:
        stop.set()
        await load
    assert alert["state"] in ("pending", "firing")
    assert alert["labels"]["pool"] == "qwen-7b" and alert["labels"]["severity"] == "critical"
