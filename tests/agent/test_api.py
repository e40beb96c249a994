"""Agent API: health, readiness through the lifecycle, drain and reset, status, metrics, OpenAI errors, and the
OpenAPI document held to the contract in docs/architecture.md."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from agent.api import create_app
from agent.node import Agent, AgentOptions
from agent.states import Event
from tests.agent.builders import VirtualClock, api_agent
from tests.contracts import declared_routes, documented_routes, error_schemas
from tests.support.stacks import pool


@dataclass
class Api:
    agent: Agent
    http: httpx.AsyncClient


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with httpx.AsyncClient(trust_env=False) as unused:
        agent = api_agent(unused)
        transport = httpx.ASGITransport(app=create_app(agent))
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            yield Api(agent, http)


def drive(agent: Agent, *events: Event) -> None:
    for event in events:
        agent.supervisor.machine.fire(event)


@pytest.mark.parametrize(
    ("case", "events", "ready_status", "state"),
    [
        ("starting: not ready", (), 503, "starting"),
        ("warming: not ready", (Event.HEALTHY,), 503, "warming"),
        ("ready", (Event.HEALTHY, Event.WARMED), 200, "ready"),
        ("draining: not ready", (Event.HEALTHY, Event.WARMED, Event.DRAIN), 503, "draining"),
        ("crash-looping", (Event.ENGINE_EXITED, Event.CRASH_LOOP), 503, "failed"),
    ],
)
async def test_readiness_follows_the_state_and_health_stays_up(
    api: Api, case: str, events: tuple[Event, ...], ready_status: int, state: str
) -> None:
    drive(api.agent, *events)
    readyz = await api.http.get("/readyz")
    assert (readyz.status_code, readyz.json()) == (ready_status, {"ready": ready_status == 200, "state": state}), case
    healthz = await api.http.get("/healthz")
    assert (healthz.status_code, healthz.json()) == (200, {"status": "ok", "state": state}), case


async def test_drain_drops_readiness_at_once_and_is_accepted_once(api: Api) -> None:
    drive(api.agent, Event.HEALTHY, Event.WARMED)
    first = await api.http.post("/drain")
    assert (first.status_code, first.json()) == (202, {"accepted": True, "state": "draining"})
    assert (await api.http.get("/readyz")).status_code == 503
    again = await api.http.post("/drain")
    assert (again.status_code, again.json()) == (202, {"accepted": False, "state": "draining"})


async def test_reset_applies_only_to_a_failed_replica(api: Api) -> None:
    refused = await api.http.post("/reset")
    assert refused.status_code == 409
    assert refused.json() == {
        "error": {
            "message": "reset applies to a failed replica; state is starting",
            "type": "conflict_error",
            "param": None,
            "code": 409,
        }
    }
    drive(api.agent, Event.ENGINE_EXITED, Event.CRASH_LOOP)
    accepted = await api.http.post("/reset")
    assert (accepted.status_code, accepted.json()) == (200, {"accepted": True, "state": "failed"})


async def test_status_reports_identity_state_and_transitions(api: Api) -> None:
    drive(api.agent, Event.HEALTHY)
    response = await api.http.get("/status")
    assert response.status_code == 200
    body = response.json()
    assert body == api.agent.status().model_dump(mode="json", by_alias=True)
    assert (body["replica"], body["pool"], body["state"], body["ready"]) == ("r0", "qwen-7b", "warming", False)
    assert body["transitions"] == [{"from": "starting", "event": "healthy", "to": "warming", "ago_s": 0.0}]
    assert body["engine"]["kind"] == "sim" and body["engine"]["argv"]


async def test_metrics_are_prometheus_text(api: Api) -> None:
    response = await api.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "llmfleet_agent_" in response.text


@pytest.mark.parametrize(
    ("method", "path", "status", "type_"),
    [
        ("GET", "/nope", 404, "not_found_error"),
        ("GET", "/drain", 405, "invalid_request_error"),
        ("DELETE", "/status", 405, "invalid_request_error"),
    ],
)
async def test_errors_use_openai_error_json(api: Api, method: str, path: str, status: int, type_: str) -> None:
    response = await api.http.request(method, path)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (type_, status) and path in error["message"]


async def test_openapi_document_matches_the_documented_contract(api: Api) -> None:
    openapi = (await api.http.get("/openapi.json")).json()
    assert declared_routes(openapi) == documented_routes("Agent")
    errors = error_schemas(openapi)
    assert errors and set(errors.values()) == {"#/components/schemas/OpenAIError"}
    assert "422" not in {status for _, _, status in errors}


async def test_docs_page_is_served(api: Api) -> None:
    response = await api.http.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in response.text


async def test_a_kv_events_pools_report_names_the_engines_event_socket_at_the_advertised_host() -> None:
    async with httpx.AsyncClient() as http:
        options = AgentOptions(
            replica="r0", port=1, engine_port=2, engine_host="0.0.0.0", advertise_host="10.0.0.7", kv_events_port=5557
        )
        with_events = Agent(pool(**{"engine.kvEvents": True}), options, http, VirtualClock())
        assert with_events.make_report(with_events.reporter.last_load).kv_events_url == "tcp://10.0.0.7:5557"
        assert "--kv-events-config" in with_events.launcher.argv()
        without = Agent(pool(), options, http, VirtualClock())  # the port is ignored where the pool publishes none
        assert without.make_report(without.reporter.last_load).kv_events_url is None
        assert "--kv-events-config" not in without.launcher.argv()
