"""Canary rollouts on the whole local fleet (`llmfleet up`): `llmfleet rollout start`, then the control plane alone
rolls a bad candidate back, or promotes a good one and drains the old pool, while a load runs through the alias.

One fleet for the module, three pools behind the alias ``chat``: the baseline ``qwen-v1`` (all of it), ``qwen-bad``
whose simulator fails a fifth of its requests, and ``qwen-good``; the tests run in file order. Steps 10, 50, 100
with a 3 s bake and 20 requests a side. Failures are told apart by pool with the gateway's own request counter,
labelled by each pool's served model name.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fleet.protocol.control_auth import CONTROL_TOKEN_ENV
from tests.llmfleet.local.conftest import FAST, Fleet, Load, running_fleet
from tests.support.stacks import write_stack

pytestmark = pytest.mark.slow

SECRET = "rollout-e2e-fleet-secret"
# Judged on the error rate alone: a p99 over 20 requests is their slowest one, which on a busy machine is noise (the
# latency judgements are the canary's unit tests').
ROLLOUT = {
    "steps": [10, 50, 100],
    "bakeS": 3,
    "minSamples": 20,
    "tolerance": 0.5,
    "baselineAfter": "zero",
    "metrics": ["errorRate"],
}


def _pool(name: str, *extra_args: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "servedModelName": name,  # the gateway's request counter is labelled by it: failures per pool
        "engine": {
            "kind": "sim",
            "maxNumSeqs": 32,
            "maxModelLen": 4096,
            "extraArgs": list(extra_args),
            "sim": {"gpuProfile": "a100-80gb", "startupSeconds": 0.3},
        },
        "replicas": {"min": 1, "max": 2},
        "workload": {"meanPromptTokens": 32, "meanOutputTokens": 8, "peakQps": 10},
        "coldStartSeconds": 8,
        "slo": {"ttftP99Ms": 20000},
        "drain": {"graceSeconds": 10, "propagationSeconds": 0.5},
    }


STACK: dict[str, Any] = {
    **FAST,
    "environment": "e2e-rollout",
    "pools": [_pool("qwen-v1"), _pool("qwen-bad", "--fault-error-rate", "0.2"), _pool("qwen-good")],
    "aliases": {
        "chat": {"pools": {"qwen-v1": 100, "qwen-bad": 0, "qwen-good": 0}, "sticky": "none", "rollout": ROLLOUT}
    },
    "autoscaling": {
        **FAST["autoscaling"],
        "policy": {"name": "target-tracking", "params": {"releaseTimeConstantS": 0}},
        "scaleDownStabilizationS": 2,
    },
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("rollouts")
    stack = write_stack(tmp / "Pulumi.e2e-rollout.yaml", "local", **STACK)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CONTROL_TOKEN_ENV, SECRET)  # `up` makes it the fleet secret: `llmfleet rollout` holds it
        with running_fleet(stack, tmp / "logs", "--no-prometheus") as running:
            yield running


def rollout(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "llmfleet.cli", "rollout", *args, "--control-plane", fleet.control_plane]
    env = {**os.environ, CONTROL_TOKEN_ENV: SECRET}
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)


def server_errors_by_pool(fleet: Fleet) -> Counter[str]:
    """5xx answers per pool (its served model name) from the gateway's admin /metrics."""
    [admin] = re.findall(r"metrics: (http://[\d.:]+)\)", fleet.output[0])
    text = httpx.get(f"{admin}/metrics", timeout=5).text
    out: Counter[str] = Counter()
    for model, status, value in re.findall(
        r'^llmfleet_gateway_requests_total\{[^}]*model="([^"]+)"[^}]*status="(\d+)"[^}]*\} (\S+)$', text, re.M
    ):
        if int(status) >= 500:
            out[model] += int(float(value))
    return out


async def status_of(cp: httpx.AsyncClient) -> dict[str, Any]:
    body: dict[str, Any] = (await cp.get("/v1/rollouts/chat")).raise_for_status().json()
    return body


async def test_a_candidate_failing_a_fifth_of_its_requests_is_rolled_back_while_the_baseline_fails_none(
    fleet: Fleet,
) -> None:
    async with httpx.AsyncClient(base_url=fleet.control_plane, timeout=5, headers=fleet.headers) as cp:
        async with Load(fleet) as load:
            started = rollout(fleet, "start", "--alias", "chat", "--candidate", "qwen-bad")
            assert started.returncode == 0, started.stderr
            assert "qwen-v1 -> qwen-bad at 10%" in started.stdout

            async def rolled_back() -> dict[str, Any] | None:
                status = await status_of(cp)
                return status if status["phase"] == "rolled-back" else None

            status = await fleet.until(rolled_back, timeout_s=90, what="the bad candidate rolled back")
            await load.stop()
        weights = (await cp.get("/v1/aliases")).json()["aliases"]["chat"]["pools"]
        decisions = (await cp.get("/v1/decisions", params={"pool": "qwen-bad"})).json()["decisions"]

    assert "error rate" in status["reason"] and "on qwen-bad against" in status["reason"], status["reason"]
    assert weights == {"qwen-v1": 100, "qwen-bad": 0, "qwen-good": 0}
    assert [d["action"] for d in decisions if d["kind"] == "rollout"][-1] == "rollback"
    errors = server_errors_by_pool(fleet)
    assert errors["qwen-v1"] == 0 and load.ok["qwen-v1"] > 100  # the baseline served throughout, never failing
    assert 0 < sum(load.failed.values()) <= errors["qwen-bad"], (load.failed, errors)  # the canary's own

    shown = rollout(fleet, "status", "--alias", "chat")
    assert shown.returncode == 1 and "ROLLED-BACK" in shown.stdout  # 1: the rollout did not go through
    table = subprocess.run(
        [sys.executable, "-m", "llmfleet.cli", "status", "--control-plane", fleet.control_plane],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    # At 10% or 50%: the step whose window first holds enough of its failures.
    assert "rollout chat: qwen-v1 -> qwen-bad at 0% (rolled-back): rolled back at " in table


async def test_a_good_candidate_is_promoted_and_the_old_pool_drained_without_a_failed_request(fleet: Fleet) -> None:
    failed_before = sum(server_errors_by_pool(fleet).values())
    async with httpx.AsyncClient(base_url=fleet.control_plane, timeout=5, headers=fleet.headers) as cp:

        async def baseline_gone() -> bool:
            replicas = (await cp.get("/v1/pools/qwen-v1/replicas")).json()["replicas"]
            return all(r["state"] in ("draining", "stopped") for r in replicas)

        async with Load(fleet) as load:
            started = rollout(fleet, "start", "--alias", "chat", "--candidate", "qwen-good")
            assert started.returncode == 0, started.stderr

            async def promoted() -> bool:
                return (await status_of(cp))["phase"] == "promoted"

            await fleet.until(promoted, timeout_s=90, what="the good candidate promoted")
            await fleet.until(baseline_gone, timeout_s=30, what="the old pool drained to no replica")
            await load.stop()
        weights = (await cp.get("/v1/aliases")).json()["aliases"]["chat"]["pools"]
        actions = [d["action"] for d in (await cp.get("/v1/decisions")).json()["decisions"] if d["kind"] == "rollout"]
        downs = [
            d
            for d in (await cp.get("/v1/decisions", params={"pool": "qwen-v1"})).json()["decisions"]
            if d["kind"] == "scale-down"
        ]

    assert weights == {"qwen-v1": 0, "qwen-bad": 0, "qwen-good": 100}
    assert [a for a in actions if a != "hold"][-3:] == ["start", "step", "promote"]
    assert downs and downs[-1]["target"] == 0
    assert load.failed == Counter(), load.failed  # drained, not cut: every request finished
    assert sum(server_errors_by_pool(fleet).values()) == failed_before
    assert load.ok["qwen-good"] > 0 and load.ok["qwen-v1"] > 0
