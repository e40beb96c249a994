"""Agent API fuzzed from its own OpenAPI document (schemathesis): no request, valid or malformed, gets a 5xx.
The agent is real but its supervisor never runs, so a fuzzed ``POST /drain`` only flips its state. Seeded and
bounded, so every run sends the same requests."""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from agent.api import create_app
from agent.states import Event
from tests.agent.builders import api_agent

CONFIG = {"seed": 20_260_501, "generation": {"mode": "all", "deterministic": True, "database": "none"}}

agent = api_agent(httpx.AsyncClient(trust_env=False))  # never sends: no engine, no control plane
agent.supervisor.machine.fire(Event.HEALTHY)
agent.supervisor.machine.fire(Event.WARMED)  # ready, so /drain has something to drain
schema = schemathesis.openapi.from_asgi(
    "/openapi.json", create_app(agent), config=schemathesis.Config.from_dict(CONFIG)
)


@schema.parametrize()
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
