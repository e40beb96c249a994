"""An agent, its simulated engine and a control plane sharing a fleet secret and an engine key: reports reach the
control plane, drain and reset need the control plane's credential, and the engine serves only with the key. An
agent with no credential and no ``--auth none`` does not start."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleet.protocol.control_auth import CONTROL_TOKEN_ENV, ENGINE_API_KEY_ENV
from fleet.protocol.ports import free_port
from llmfleet.local.procs import Child
from tests.agent.conftest import AgentProc
from tests.support.auth import NO_CREDENTIAL_ENV, assert_names_the_ways_out
from tests.support.procs import Proc, Procs
from tests.support.stacks import write_stack
from tests.support.wait import wait_for

SECRET = secrets.token_hex(32)
ENGINE_KEY = secrets.token_hex(32)
ENV = {CONTROL_TOKEN_ENV: SECRET, ENGINE_API_KEY_ENV: ENGINE_KEY}


def completion(agent: AgentProc) -> dict[str, object]:
    return {"model": agent.status()["model"], "prompt": "hi", "max_tokens": 2}


def bearer(kind: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {kind}:{SECRET}"}


def start_fleet(procs: Procs, tmp: Path) -> tuple[Proc, AgentProc]:
    """A control plane and the agent ``r-auth`` reporting to it, both with `ENV`; returns once the agent is ready."""
    stack = write_stack(tmp / "Pulumi.agenttest.yaml", "local-sim")
    cp_port, port = free_port(), free_port()
    cp_argv = ["control-plane", "--stack", str(stack), "--port", str(cp_port), "--dry-run"]
    cp = Proc(Child("control-plane", cp_argv, tmp / "cp.log", env=ENV), f"http://127.0.0.1:{cp_port}")
    procs.add(cp, stop_timeout_s=10)
    cp.wait_http("/healthz", timeout_s=30)
    argv = [
        "agent", "--stack", str(stack), "--pool", "qwen-7b", "--port", str(port), "--replica", "r-auth",
        "--control-plane", cp.url, "--log-dir", str(tmp / "r-auth"), "--probe-interval", "0.2",
    ]  # fmt: skip
    agent = AgentProc(Child("r-auth", argv, tmp / "agent.log", env=ENV), f"http://127.0.0.1:{port}")
    agent.auth_headers = bearer("control-plane")
    procs.add(agent, stop_timeout_s=20)
    agent.wait_http("/readyz", timeout_s=40)  # the warm-up completion went through with the engine key
    agent.status()
    return cp, agent


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, AgentProc]]:
    """One fleet for the tests that only look or are refused: none drains, stops or resets its agent."""
    tmp = tmp_path_factory.mktemp("auth-fleet")
    procs = Procs(tmp)
    try:
        yield start_fleet(procs, tmp)
    finally:
        procs.close()


@pytest.fixture
def own_fleet(procs: Procs, tmp_path: Path) -> tuple[Proc, AgentProc]:
    """A fleet of the test's own, for a test that drains or stops its agent."""
    return start_fleet(procs, tmp_path)


def test_authenticated_reports_reach_the_control_plane(fleet: tuple[Proc, AgentProc]) -> None:
    cp, agent = fleet

    def listed() -> bool | None:
        answer = cp.get("/v1/pools/qwen-7b/replicas", headers=bearer("gateway")).json()
        return True if any(r["replica"] == "r-auth" for r in answer["replicas"]) else None

    wait_for(listed, timeout_s=20, what="r-auth in discovery", diagnostics=agent.tail)
    assert "report rejected" not in agent.text()


def test_the_status_read_names_the_engine_only_to_fleet_members(fleet: tuple[Proc, AgentProc]) -> None:
    _, agent = fleet
    refused = agent.get("/status")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert agent.get("/status", headers={"Authorization": "Bearer gateway:wrong"}).status_code == 401
    for kind in ("agent", "gateway", "control-plane"):
        assert agent.get("/status", headers=bearer(kind)).json()["replica"] == "r-auth"
    assert agent.get("/readyz").status_code == 200 and agent.get("/metrics").status_code == 200  # probes, scrapes


def test_drain_and_reset_without_the_control_planes_credential_are_refused(fleet: tuple[Proc, AgentProc]) -> None:
    _, agent = fleet
    engine = agent.status()["engine_url"]
    assert agent.post("/drain").status_code == 401
    assert agent.post("/drain", headers={"Authorization": "Bearer control-plane:wrong"}).status_code == 401
    refused = agent.post("/drain", headers=bearer("agent"))
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
    assert agent.post("/reset").status_code == 401
    assert agent.readyz() == 200  # still in rotation
    served = httpx.post(
        f"{engine}/v1/completions",
        json=completion(agent),
        headers={"Authorization": f"Bearer {ENGINE_KEY}"},
        timeout=10,
    )
    assert served.status_code == 200


def test_the_engine_refuses_completions_without_the_key(fleet: tuple[Proc, AgentProc]) -> None:
    _, agent = fleet
    engine = agent.status()["engine_url"]
    refused = httpx.post(f"{engine}/v1/completions", json=completion(agent), timeout=10)
    assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
    wrong = httpx.post(
        f"{engine}/v1/completions", json=completion(agent), headers={"Authorization": "Bearer x"}, timeout=10
    )
    assert wrong.status_code == 401
    assert httpx.get(f"{engine}/health", timeout=5).status_code == 200  # probes stay open, as on vLLM
    assert httpx.get(f"{engine}/metrics", timeout=5).status_code == 200
    assert ENGINE_KEY not in agent.text()  # never logged


def test_the_control_planes_credential_drains_the_agent(own_fleet: tuple[Proc, AgentProc]) -> None:
    _, agent = own_fleet
    accepted = agent.post("/drain", headers=bearer("control-plane"))
    assert accepted.status_code == 202 and accepted.json()["accepted"] is True
    assert agent.wait(30) == 0


def test_prestop_from_loopback_needs_no_credential(own_fleet: tuple[Proc, AgentProc]) -> None:
    _, agent = own_fleet
    assert agent.get("/prestop").status_code == 200
    assert agent.wait(30) == 0


def test_an_agent_without_a_credential_or_auth_none_exits_2_before_starting_its_engine(tmp_path: Path) -> None:
    stack = write_stack(tmp_path / "Pulumi.agenttest.yaml", "local-sim")
    argv = ["agent", "--stack", str(stack), "--pool", "qwen-7b", "--port", str(free_port()), "--control-plane", "none"]
    agent = Proc(Child("agent", argv, tmp_path / "agent.log", env=NO_CREDENTIAL_ENV))
    try:
        assert agent.wait(30) == 2
        assert_names_the_ways_out(agent.text())
        assert agent.text().strip().splitlines() == [agent.text().strip()]  # that one line: nothing was started
    finally:
        agent.kill()
