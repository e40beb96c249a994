"""``llmfleet up --stack local-pd``: one prefill and one decode replica, each agent running its role's engine.

Real processes (the control plane starts both pools' agents, each supervising a simulated engine launched with its
role's ``--kv-transfer-config``), short timings, no Prometheus; the fleet is stopped after, leaving no process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fleet.protocol.keys import DEMO_API_KEY
from fleet.protocol.promtext import gauge_value, parse
from tests.llmfleet.local.conftest import Fleet, running_fleet
from tests.support.stacks import write_stack
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

DECODE, PREFILL = "qwen-7b", "qwen-7b-prefill"
SERVED = "qwen2.5-7b-instruct"

SHORT: dict[str, Any] = {
    "pools.0.engine.sim.startupSeconds": 0.3,
    "pools.0.coldStartSeconds": 20,  # a deadline, not a delay: a busy two-core machine takes seconds to import a sim
    "pools.0.drain": {"graceSeconds": 10, "propagationSeconds": 0.5},
    "autoscaling.intervalS": 0.5,
    "controlPlane": {"reportIntervalS": 0.25, "staleAfterS": 2},
}


def _ready_one(fleet: Fleet, pool: str) -> dict[str, Any]:
    """The pool's one replica, as the control plane lists it to gateways (``up`` waited for it to be ready)."""
    url = f"{fleet.control_plane}/v1/pools/{pool}/replicas"
    replicas = httpx.get(url, headers=fleet.headers, timeout=5).json()["replicas"]
    assert [r["state"] for r in replicas] == ["ready"], replicas
    replica: dict[str, Any] = replicas[0]
    return replica


def test_up_on_local_pd_runs_a_prefill_and_a_decode_replica_with_their_roles_engines(tmp_path: Path) -> None:
    stack = write_stack(tmp_path / "Pulumi.local-pd.yaml", "local-pd", **SHORT)
    with running_fleet(stack, tmp_path / "logs", "--no-prometheus") as fleet:
        assert "qwen-7b (decode) x1..4, qwen-7b-prefill (prefill) x1..2" in fleet.output[0]
        channels = set()
        for pool, role, kv_role in ((DECODE, "decode", "kv_consumer"), (PREFILL, "prefill", "kv_producer")):
            report = _ready_one(fleet, pool)["last_report"]
            assert (report["pool"], report["role"]) == (pool, role)
            status = httpx.get(f"{report['agent_url']}/status", headers=fleet.headers, timeout=5).json()
            assert (status["pool"], status["role"], status["side_channel"]) == (pool, role, report["side_channel"])
            argv = status["engine"]["argv"]
            config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            assert config["kv_role"] == kv_role and config["kv_connector"] == "NixlConnector"
            channels.add(report["side_channel"])
        assert len(channels) == 2 and all(c.startswith("127.0.0.1:") for c in channels)  # a free port each
        _a_long_prompt_takes_the_two_legs(fleet)


def _a_long_prompt_takes_the_two_legs(fleet: Fleet) -> None:
    """Through the gateway, which found the prefill role pool's replica through the control plane: a prompt over
    the stack's threshold (256 tokens) is prefilled on the prefill replica and its KV cache read by the decode
    replica (its engine's NIXL transfer count). Fresh prompts until the gateway has discovered the prefill replica
    (before that, requests go aggregated), within a deadline."""
    decode_engine = _ready_one(fleet, DECODE)["engine_url"]
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key=DEMO_API_KEY, max_retries=0, timeout=60)
    sent = iter(range(1000))

    def transferred() -> bool:
        fresh = next(sent)
        words = " ".join(f"w{fresh}x{i}" for i in range(600))
        answer = client.chat.completions.create(
            model=SERVED, messages=[{"role": "user", "content": words}], max_tokens=8
        )
        assert answer.usage is not None and answer.usage.completion_tokens == 8
        samples = parse(httpx.get(f"{decode_engine}/metrics", timeout=5).text)
        return (
            "vllm:nixl_xfer_time_seconds_count" in samples
            and gauge_value(samples, "vllm:nixl_xfer_time_seconds_count") >= 1
        )

    try:
        wait_for(transferred, timeout_s=30, interval_s=0.5, what="a prompt prefilled on the prefill replica")
    finally:
        client.close()
