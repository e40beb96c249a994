"""Control plane over real HTTP: reports, staleness, discovery, leases, decisions, metrics, OpenAI errors, and the
OpenAPI document held to the contract in docs/architecture.md."""

from __future__ import annotations

import httpx
import pytest

from control_plane.api.app import create_app
from fleet.protocol.control_api import MAX_BODY_BYTES
from fleet.protocol.control_auth import ControlAuth, SharedSecret
from fleet.protocol.wire import LeaseGrant, ReplicaList
from tests.contracts import declared_routes, documented_routes, error_schemas
from tests.control_plane.builders import report
from tests.control_plane.conftest import Clock, Served, build_control_plane

POOL = "qwen-7b"


async def post(s: Served, replica: str, **load: object) -> None:
    body = report(replica, ts=s.clock.now, **load).model_dump(mode="json")
    response = await s.http.post("/v1/reports", json=body)
    assert response.status_code == 200, response.text


async def test_reports_feed_discovery_and_go_stale(served: Served) -> None:
    await post(served, "a", waiting=3)
    await post(served, "b", state="starting")
    listed = ReplicaList.model_validate_json((await served.http.get(f"/v1/pools/{POOL}/replicas")).content)
    assert [(r.replica, r.state, r.stale) for r in listed.replicas] == [("a", "ready", False), ("b", "starting", False)]
    assert listed.model == "qwen2.5-7b-instruct"
    assert listed.replicas[0].last_report.waiting == 3

    served.clock.now += served.cp.spec.control_plane.stale_after_s + 1
    await post(served, "b")
    listed = ReplicaList.model_validate_json((await served.http.get(f"/v1/pools/{POOL}/replicas")).content)
    assert {r.replica: r.stale for r in listed.replicas} == {"a": True, "b": False}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("GET", "/v1/pools/nope/replicas", None, 404, "pool"),
        ("POST", "/v1/reports", {"replica": "a"}, 400, "pool"),
        ("POST", "/v1/reports", report("a", pool="nope").model_dump(mode="json"), 404, "pool"),
        ("POST", "/v1/reports", [1, 2], 400, None),
        ("POST", "/v1/leases/restart", {"pool": "nope", "replica": "a"}, 404, "pool"),
        ("POST", "/v1/leases/restart", {"pool": POOL, "replica": "a", "ttl_s": "soon"}, 400, "ttl_s"),
        ("DELETE", "/v1/leases/restart/nope/a", None, 404, "pool"),
        ("GET", "/v1/decisions?limit=x", None, 400, "limit"),
        ("GET", "/v1/nope", None, 404, None),
        ("PUT", "/v1/reports", None, 405, None),
    ],
)
async def test_errors_use_openai_error_json(
    served: Served, method: str, path: str, body: object, status: int, param: str | None
) -> None:
    response = await served.http.request(method, path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] and error["code"] == status
    assert error["param"] == param


async def test_invalid_json_and_oversized_bodies_are_openai_errors(served: Served) -> None:
    headers = {"Content-Type": "application/json"}
    broken = await served.http.post("/v1/reports", content=b'{"replica": ', headers=headers)
    assert (broken.status_code, broken.json()["error"]["type"]) == (400, "invalid_request_error")
    huge = await served.http.post("/v1/reports", content=b" " * (MAX_BODY_BYTES + 1), headers=headers)
    assert (huge.status_code, huge.json()["error"]["code"]) == (413, 413)


async def test_a_wrong_method_says_which_are_allowed(served: Served) -> None:
    response = await served.http.get("/v1/leases/restart")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


async def test_openapi_document_matches_the_documented_contract(served: Served) -> None:
    openapi = (await served.http.get("/openapi.json")).json()
    assert declared_routes(openapi) == documented_routes("Control plane")
    errors = error_schemas(openapi)
    assert set(errors.values()) == {"#/components/schemas/OpenAIError"}
    assert "422" not in {status for _, _, status in errors}
    assert {("POST", "/v1/reports", "400"), ("POST", "/v1/leases/restart", "409")} <= set(errors)
    report_body = openapi["paths"]["/v1/reports"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert report_body == {"$ref": "#/components/schemas/LoadReport"}


async def test_docs_page_is_served(served: Served) -> None:
    response = await served.http.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in response.text


async def test_restart_leases_never_exceed_max_unavailable_and_expire(served: Served) -> None:
    async def ask(replica: str, ttl: float = 30.0) -> int:
        response = await served.http.post("/v1/leases/restart", json={"pool": POOL, "replica": replica, "ttl_s": ttl})
        if response.status_code == 200:
            assert replica in LeaseGrant.model_validate_json(response.content).holders
        return response.status_code

    assert await ask("a") == 200
    assert await ask("a") == 200  # renewal by the holder
    assert await ask("b") == 409
    assert (await served.http.delete(f"/v1/leases/restart/{POOL}/a")).json() == {"released": True}
    assert await ask("b", ttl=5) == 200
    assert await ask("c") == 409
    served.clock.now += 6  # b died without releasing: its lease expires
    assert await ask("c") == 200

    leases = (await served.http.get("/v1/leases")).json()
    assert list(leases["holders"][POOL]) == ["c"]
    events = [(e["event"], e["replica"]) for e in leases["history"]]
    assert events == [
        ("grant", "a"),
        ("renew", "a"),
        ("refuse", "b"),
        ("release", "a"),
        ("grant", "b"),
        ("refuse", "c"),
        ("expire", "b"),
        ("grant", "c"),
    ]
    held: set[str] = set()
    for event in leases["history"]:  # replay: never two holders at once (maxUnavailable 1)
        if event["event"] in ("grant", "renew"):
            held.add(event["replica"])
        elif event["event"] in ("release", "expire"):
            held.discard(event["replica"])
        assert len(held) <= 1


async def test_queue_growth_scales_up_and_the_log_says_why(served: Served) -> None:
    await post(served, "a", waiting=20, running=30)
    [decision] = await served.loop.tick()
    assert decision.kind == "scale-up" and decision.target == 4  # 20 queued / 4 per replica = 5, max 4
    logged = (await served.http.get("/v1/decisions", params={"pool": POOL})).json()["decisions"]
    assert logged[-1]["kind"] == "scale-up"
    assert logged[-1]["reason"].startswith("queue needs 5.00 replicas")
    assert logged[-1]["inputs"]["queue_depth"] == 20


async def test_a_replica_whose_reports_stop_is_not_idle_capacity(served: Served) -> None:
    await post(served, "a", waiting=0, running=2)
    await post(served, "b", waiting=0, running=0)
    served.clock.now += 6  # b stops reporting; a keeps going
    await post(served, "a", waiting=6, running=10)
    [decision] = await served.loop.tick()
    assert decision.current == 2 and decision.target == 3  # two to serve a's queue, b replaced, not counted
    assert decision.inputs["unknown"] == ["b"]
    assert decision.inputs["capacity"] == 1


async def test_stale_replicas_block_scale_down(served: Served) -> None:
    served.cp.registry.forget_after_s = 120.0  # as with controlPlane.forgetAfterS 120: c stays listed, stale
    await post(served, "a")
    await post(served, "b")
    await post(served, "c")
    served.clock.now += 6
    await post(served, "a")
    await post(served, "b")
    for _ in range(15):  # long past the 20 s window, c still silent
        served.clock.now += 2
        await post(served, "a")
        await post(served, "b")
        [decision] = await served.loop.tick()
        assert decision.kind != "scale-down"
    assert "scale-down blocked" in decision.reason and "c" in decision.reason


async def test_idle_pool_shrinks_only_after_the_stabilisation_window(served: Served) -> None:
    kinds = []
    for _ in range(14):
        for name in ("a", "b", "c"):
            await post(served, name)
        [decision] = await served.loop.tick()
        kinds.append((served.clock.now - 1_000_000.0, decision.kind))
        served.clock.now += 2
    first_down = next(t for t, k in kinds if k == "scale-down")
    assert first_down >= 20.0
    assert served.dry.applied[0].kind == "scale-down"
    assert served.dry.applied[0].victims  # least-loaded, named


async def test_pools_and_metrics(served: Served) -> None:
    await post(served, "a", waiting=1)
    await served.loop.tick()
    pools = (await served.http.get("/v1/pools")).json()["pools"]
    assert pools[0]["pool"] == POOL and pools[0]["ready"] == 1 and pools[0]["last_decision"]["kind"]
    text = (await served.http.get("/metrics")).text
    assert 'llmfleet_pool_replicas{pool="qwen-7b",state="ready"} 1.0' in text
    assert "llmfleet_control_plane_reports_total" in text
    assert (await served.http.get("/healthz")).status_code == 200


def test_victims_are_launching_first_then_least_loaded_never_unknown() -> None:
    from control_plane.loop import pick_victims
    from control_plane.scaling.context import ReplicaLoad
    from tests.control_plane.builders import context, ready, stale

    ctx = context(
        ready("busy", waiting=3, running=10),
        ready("light", running=1),
        ready("idle"),
        ReplicaLoad("new", "launching"),
        stale("silent"),
        ReplicaLoad("leaving", "draining"),
    )
    assert pick_victims(ctx, 3) == ("new", "idle", "light")
    assert pick_victims(ctx, 9) == ("new", "idle", "light", "busy", "silent")


async def test_an_agent_takes_and_gives_back_only_the_lease_of_the_replica_it_reported_from_its_address() -> None:
    cp, _, dry = build_control_plane(Clock())
    app = create_app(cp, ControlAuth(SharedSecret("s3cret")))
    headers = {"Authorization": "Bearer agent:s3cret"}

    def client(ip: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(ip, 40000)), base_url="http://cp")

    body = report("r-a", engine_url="http://10.0.0.7:8001").model_dump(mode="json")
    lease = {"pool": "qwen-7b", "replica": "r-a"}
    async with client("10.0.0.7") as own, client("10.0.0.8") as other:
        assert (await own.post("/v1/reports", json=body, headers=headers)).status_code == 200
        taken = await other.post("/v1/leases/restart", json=lease, headers=headers)
        assert (taken.status_code, taken.json()["error"]["type"]) == (403, "permission_error")
        assert (await own.post("/v1/leases/restart", json=lease, headers=headers)).status_code == 200
        released = await other.delete("/v1/leases/restart/qwen-7b/r-a", headers=headers)
        assert released.status_code == 403
        released = await own.delete("/v1/leases/restart/qwen-7b/r-a", headers=headers)
        assert released.json() == {"released": True}
    await dry.close()


async def test_a_replica_draining_for_its_planned_restart_is_not_replaced(served: Served) -> None:
    await post(served, "a", state="draining")  # its agent drains it to restart it in the restart window
    assert (await served.http.post("/v1/leases/restart", json={"pool": POOL, "replica": "a"})).status_code == 200
    [planned] = await served.loop.tick()
    assert planned.kind == "hold", planned.reason
    await served.http.delete(f"/v1/leases/restart/{POOL}/a")
    await post(served, "a", state="draining")
    [leaving] = await served.loop.tick()
    assert leaving.kind == "scale-up", leaving.reason  # draining with no lease: it is going, and is replaced
