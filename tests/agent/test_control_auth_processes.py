"""An agent, its simulated engine and a control plane sharing a fleet secret and an engine key: reports reach the
control plane, drain and reset need the control plane's credential, and the engine serves only with the key."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from fleet.protocol.control_auth import CONTROL_TOKEN_ENV, ENGINE_API_KEY_ENV
from fleet.protocol.ports import free_port
from llmfleet.local.procs import Child
from tests.agent.conftest import AgentProc
from tests.support.procs import Proc, Procs
from tests.support.wait import wait_for

SECRET = secrets.token_hex(32)
ENGINE_KEY = secrets.token_hex(32)
ENV = {CONTROL_TOKEN_ENV: SECRET, ENGINE_API_KEY_ENV: ENGINE_KEY}


def completion(agent: AgentProc) -> dict[str, object]:
    return {"model": agent.status()["model"], "prompt": "hi", "max_tokens": 2}


def bearer(kind: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {kind}:{SECRET}"}


@pytest.fixture
def fleet(procs: Procs, tmp_path: Path, write_stack: Callable[..., Path]) -> tuple[Proc, AgentProc]:
    stack = write_stack()
    cp_port, port = free_port(), free_port()
    cp_argv = ["control-plane", "--stack", str(stack), "--port", str(cp_port), "--dry-run"]
    cp = Proc(Child("control-plane", cp_argv, tmp_path / "cp.log", env=ENV), f"http://127.0.0.1:{cp_port}")
    procs.add(cp, stop_timeout_s=10)
    cp.wait_http("/healthz", timeout_s=30)
    argv = [
        "agent", "--stack", str(stack), "--pool", "qwen-7b", "--port", str(port), "--replica", "r-auth",
        "--control-plane", cp.url, "--log-dir", str(tmp_path / "r-auth"), "--probe-interval", "0.2",
    ]  # fmt: skip
    agent = AgentProc(Child("r-auth", argv, tmp_path / "agent.log", env=ENV), f"http://127.0.0.1:{port}")
    procs.add(agent, stop_timeout_s=20)
    agent.wait_http("/readyz", timeout_s=40)  # the warm-up completion went through with the engine key
    agent.status()
    return cp, agent


def test_authenticated_reports_reach_the_control_plane(fleet: tuple[Proc, AgentProc]) -> None:
    cp, agent = fleet

    def listed() -> bool | None:
        answer = cp.get("/v1/pools/qwen-7b/replicas").json()
        return True if any(r["replica"] == "r-auth" for r in answer["replicas"]) else None

    wait_for(listed, timeout_s=20, what="r-auth in discovery", diagnostics=agent.tail)
    assert "report rejected" not in agent.text()


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


def test_the_control_planes_credential_drains_the_agent(fleet: tuple[Proc, AgentProc]) -> None:
    _, agent = fleet
    accepted = agent.post("/drain", headers=bearer("control-plane"))
    assert accepted.status_code == 202 and accepted.json()["accepted"] is True
    assert agent.wait(30) == 0


def test_prestop_from_loopback_needs_no_credential(fleet: tuple[Proc, AgentProc]) -> None:
    _, agent = fleet
    assert agent.get("/prestop").status_code == 200
    assert agent.wait(30) == 0
