"""A disaggregated pool's prefill role pool in the control plane: its agents report under ``<pool>-prefill``, gateways
discover its replicas, operators see it, and the loop scales it within its own bounds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from control_plane.actuators import ActuatorEnv, DryRun
from control_plane.api.app import create_app
from control_plane.plane import ControlPlane
from fleet.protocol.control_api import ApiServer, bind
from fleet.protocol.wire import ReplicaList
from tests.control_plane.builders import report
from tests.control_plane.conftest import Clock, ReportedOnly, Served
from tests.support import stacks

DECODE, PREFILL = "qwen-7b", "qwen-7b-prefill"


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """A control plane over the local-pd stack (decode 1..4, prefill 1..2) whose loop decides but never acts."""
    clock = Clock()
    spec = stacks.spec("local-pd", **{"autoscaling.scaleDownStabilizationS": 20.0})
    dry = DryRun(ReportedOnly(spec, ActuatorEnv(stack="local-pd", control_plane_url="http://unused")))
    cp = ControlPlane.build(spec, clock, dry)
    assert cp.loop is not None
    server = ApiServer(create_app(cp), bind("127.0.0.1", 0))
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        yield Served(cp, cp.loop, clock, http, url, dry)
    await cp.close()
    await dry.close()
    await server.stop()


async def post(s: Served, replica: str, pool: str, **load: Any) -> None:
    role = "prefill" if pool == PREFILL else "decode"
    body = report(replica, pool=pool, ts=s.clock.now, role=role, side_channel="127.0.0.1:5600", **load)
    response = await s.http.post("/v1/reports", json=body.model_dump(mode="json"))
    assert response.status_code == 200, response.text


async def replicas(s: Served, pool: str) -> ReplicaList:
    response = await s.http.get(f"/v1/pools/{pool}/replicas")
    assert response.status_code == 200, response.text
    return ReplicaList.model_validate_json(response.content)


async def test_gateways_discover_each_roles_replicas_under_its_own_pool(served: Served) -> None:
    await post(served, "p0", PREFILL)
    await post(served, "d0", DECODE)
    prefill, decode = await replicas(served, PREFILL), await replicas(served, DECODE)
    assert [(r.replica, r.last_report.role) for r in prefill.replicas] == [("p0", "prefill")]
    assert [(r.replica, r.last_report.role) for r in decode.replicas] == [("d0", "decode")]
    assert prefill.model == decode.model == "qwen2.5-7b-instruct"
    assert prefill.replicas[0].last_report.side_channel == "127.0.0.1:5600"


async def test_operators_see_the_prefill_pool_with_its_own_bounds_and_series(served: Served) -> None:
    await post(served, "p0", PREFILL)
    await served.loop.tick()
    pools = {p["pool"]: p for p in (await served.http.get("/v1/pools")).json()["pools"]}
    assert {name: (p["min"], p["max"], p["ready"]) for name, p in pools.items()} == {
        DECODE: (1, 4, 0),
        PREFILL: (1, 2, 1),
    }
    assert pools[PREFILL]["last_decision"]["pool"] == PREFILL
    text = (await served.http.get("/metrics")).text
    assert f'llmfleet_pool_replicas{{pool="{PREFILL}",state="ready"}} 1.0' in text


async def test_a_queued_prefill_pool_scales_up_within_its_own_max_and_the_decode_pool_holds(served: Served) -> None:
    await post(served, "p0", PREFILL, waiting=20, running=30)
    await post(served, "d0", DECODE)
    decisions = {d.pool: d for d in await served.loop.tick()}
    assert set(decisions) == {DECODE, PREFILL}
    assert (decisions[PREFILL].kind, decisions[PREFILL].target) == ("scale-up", 2)  # queue asks 5; prefill max 2
    assert decisions[DECODE].kind == "hold" and decisions[DECODE].target == 1
    assert [d.pool for d in served.dry.applied] == [PREFILL]


async def test_an_idle_prefill_pool_keeps_its_minimum(served: Served) -> None:
    for _ in range(20):  # long past the 20 s stabilisation window
        await post(served, "p0", PREFILL)
        await post(served, "p1", PREFILL)
        await post(served, "d0", DECODE)
        await served.loop.tick()
        served.clock.now += 2
    downs = [d for d in served.dry.applied if d.pool == PREFILL and d.kind == "scale-down"]
    # Two idle prefill replicas shrink to its min 1, never below (the dry run removes nobody: it asks again).
    assert downs and {d.target for d in downs} == {1}


async def test_a_prefill_replica_takes_a_restart_lease_of_its_own_pool(served: Served) -> None:
    await post(served, "p0", PREFILL)
    response = await served.http.post("/v1/leases/restart", json={"pool": PREFILL, "replica": "p0", "ttl_s": 30})
    assert response.status_code == 200, response.text
    held = (await served.http.get("/v1/leases")).json()["holders"]
    assert list(held[PREFILL]) == ["p0"]
