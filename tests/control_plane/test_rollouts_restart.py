"""A control plane SIGKILLed mid-rollout and restarted on the same state dir resumes the rollout where it was.

A real ``llmfleet control-plane`` (local actuator in dry-run: nothing is launched) over the canary stack; the test
plays the gateways, reporting both pools' answers over HTTP. The rollout steps from 10% to 50%, the control plane's
process group is SIGKILLed, and a new one on the same port and state dir serves the same rollout: the same step and
weights, the same start times (so its bake is measured from when the step began), and it goes on to promote.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.protocol.control_auth import CONTROL_TOKEN_ENV
from fleet.protocol.ports import free_port
from fleet.protocol.wire import LATENCY_EDGES_S, PoolOutcomes
from tests.control_plane.builders import gateway_report
from tests.support.procs import Proc
from tests.support.stacks import write_stack
from tests.support.wait import wait_for

SECRET = "rollout-restart-secret"
OPERATOR = {"Authorization": f"Bearer control-plane:{SECRET}"}
GATEWAY = {"Authorization": f"Bearer gateway:{SECRET}"}
ROLLOUT = {"steps": [10, 50, 100], "bakeS": 1, "minSamples": 5, "tolerance": 0.5}


def answers(ok: int) -> dict[str, Any]:
    counts = [0] * (len(LATENCY_EDGES_S) + 1)
    counts[2] = ok
    outcomes = PoolOutcomes(ok=ok, errors=0, ttft=counts, tpot=counts)
    return {"outcomes": outcomes.model_dump(mode="json")}


def start(stack: Path, port: int, state: Path, log: Path) -> Proc:
    argv = ["control-plane", "--stack", str(stack), "--port", str(port), "--dry-run", "--state-dir", str(state)]
    proc = Proc.start(argv, log, url=f"http://127.0.0.1:{port}", env={CONTROL_TOKEN_ENV: SECRET})
    proc.wait_http("/healthz", timeout_s=30)
    return proc


def gateways_saw(cp: Proc, ok: int) -> None:
    """Both pools answered ``ok`` requests, as a gateway reports them."""
    for pool in ("qwen-v1", "qwen-v2"):
        body = gateway_report(pool=pool, **answers(ok)).model_dump(mode="json")
        response = cp.post("/v1/gateway-reports", json=body, headers=GATEWAY)
        assert response.status_code == 200, response.text


def rollout(cp: Proc) -> dict[str, Any]:
    body: dict[str, Any] = cp.get("/v1/rollouts/chat", headers=OPERATOR).raise_for_status().json()
    return body


def at_step(cp: Proc, step: int) -> dict[str, Any]:
    """Report answers until the rollout is at ``step`` (an index into its steps); its status then."""

    def reached() -> dict[str, Any] | None:
        gateways_saw(cp, 10)
        status = rollout(cp)
        return status if status["step"] >= step else None

    found: dict[str, Any] = wait_for(
        reached,
        timeout_s=30,
        interval_s=0.3,
        what=f"rollout step {step}",
        diagnostics=cp.tail,
        ignore=(httpx.HTTPError,),
    )
    return found


@pytest.mark.slow
def test_a_control_plane_killed_mid_rollout_resumes_it_at_the_same_step(tmp_path: Path) -> None:
    stack = write_stack(
        tmp_path / "Pulumi.canary.yaml",
        "local-canary",
        **{"aliases.chat.rollout": ROLLOUT, "autoscaling.intervalS": 0.2},
    )
    port, state = free_port(), tmp_path / "state"
    cp = start(stack, port, state, tmp_path / "cp-1.log")
    try:
        started = cp.post("/v1/rollouts", json={"alias": "chat", "candidate": "qwen-v2"}, headers=OPERATOR)
        assert started.status_code == 200, started.text
        before = at_step(cp, 1)
        assert (before["phase"], before["weight"]) == ("baking", 50)
        cp.kill()  # SIGKILL to its process group: nothing is written on the way out
    finally:
        cp.kill()

    restarted_at = time.time()
    cp = start(stack, port, state, tmp_path / "cp-2.log")
    try:
        after = rollout(cp)
        same = ("phase", "step", "weight", "weights", "started_at", "step_started_at", "baseline", "candidate")
        assert {k: after[k] for k in same} == {k: before[k] for k in same}
        assert after["step_started_at"] < restarted_at  # the step's bake counts from when it began
        aliases = cp.get("/v1/aliases", headers=GATEWAY).json()["aliases"]["chat"]["pools"]
        assert aliases == {"qwen-v1": 50, "qwen-v2": 50}  # gateways are served the rollout's weights at once

        promoted = at_step(cp, 2)
        assert (promoted["phase"], promoted["weight"]) == ("promoted", 100)
        assert promoted["started_at"] == before["started_at"]
        decisions = cp.get("/v1/decisions", params={"pool": "qwen-v2"}, headers=OPERATOR).json()["decisions"]
        assert [d["action"] for d in decisions if d["kind"] == "rollout" and d["action"] != "hold"] == ["promote"]
    finally:
        cp.kill()
