"""The whole fleet on loopback (`llmfleet up` with a short-timed stack): serve, scale out, scale back, stop.

One fleet per module; the tests run in file order: streamed completion, scale out under load and back to the
minimum with no failed request, a silent replica not counted as idle capacity, and Ctrl-C leaving no process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from fleet.protocol.keys import DEMO_API_KEY
from llmfleet.local.load import LoadStats, run_load
from tests.llmfleet.local.conftest import Fleet, stop_fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-7b-instruct"


def _load(fleet: Fleet, stats: LoadStats, **shape: Any) -> asyncio.Task[LoadStats]:
    """`run_load` through the fleet's gateway with the demo key, in the background, counting into ``stats``."""
    return asyncio.create_task(run_load(fleet.gateway, DEMO_API_KEY, MODEL, stats=stats, **shape))


async def replicas(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = (await client.get("/v1/pools/qwen-7b/replicas")).json()["replicas"]
    return listed


def test_up_prints_the_banner_and_a_streamed_completion_works(fleet: Fleet) -> None:
    banner = fleet.output[0]
    assert fleet.gateway in banner and DEMO_API_KEY in banner and "curl -N" in banner and "OpenAI(" in banner
    body = {"model": MODEL, "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello!"}]}
    headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}
    with httpx.stream("POST", f"{fleet.gateway}/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert len(lines) >= 2 and lines[-1] == "data: [DONE]"


def test_a_responses_follow_up_and_an_anthropic_message_work_on_the_fleet(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key=DEMO_API_KEY, max_retries=0)
    made = client.responses.create(model=MODEL, input="name a tide", max_output_tokens=4)
    # The agent started its engine keeping responses (engine.responsesStore): a follow-up finds the first one.
    follow = client.responses.create(model=MODEL, input="and the next?", previous_response_id=made.id)
    assert client.responses.retrieve(follow.id).output_text == follow.output_text
    assert follow.usage is not None and made.usage is not None and follow.usage.input_tokens > made.usage.input_tokens
    claude = anthropic.Anthropic(base_url=fleet.gateway, api_key=DEMO_API_KEY, max_retries=0)
    message = claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hello!"}])
    assert message.usage.output_tokens == 4 and message.content[0].type == "text"


async def test_load_scales_out_then_back_to_min_without_a_failed_request(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.control_plane, timeout=2, headers=fleet.headers) as cp:
        busy = LoadStats()
        burst = _load(fleet, busy, rps=12, duration_s=10, prompt_tokens=64, output_tokens=48, seed=1)
        served: dict[str, float] = {}

        async def scaled_out() -> bool:
            for r in await replicas(cp):
                running = r["last_report"].get("running") or 0
                served[r["replica"]] = max(served.get(r["replica"], 0), running)
            ready = [r for r in await replicas(cp) if r["state"] == "ready" and not r["stale"]]
            return len(ready) >= 2 and sum(1 for v in served.values() if v > 0) >= 2

        await fleet.until(scaled_out, timeout_s=30, what="a second replica ready and taking traffic")
        await burst
        assert busy.errors == {} and busy.ok == busy.sent > 50

        # A trickle keeps requests in flight while the pool shrinks: drained victims must not fail any.
        trickle, stop = LoadStats(), asyncio.Event()
        quiet = _load(fleet, trickle, rps=1.5, duration_s=60, prompt_tokens=32, output_tokens=24, seed=2, stop=stop)

        async def back_to_min() -> bool:
            live = [r for r in await replicas(cp) if r["state"] != "draining"]
            downs = [d for d in (await cp.get("/v1/decisions")).json()["decisions"] if d["kind"] == "scale-down"]
            return len(live) == 1 and len(downs) >= 1

        try:
            await fleet.until(back_to_min, timeout_s=60, what="the pool back at its minimum")
            await asyncio.sleep(1.0)  # the last victim's drain finishes with the trickle still running
        finally:
            stop.set()
            await quiet  # every request in flight finishes
        assert trickle.errors == {}, trickle.errors
        assert trickle.ok >= 5

        decisions = (await cp.get("/v1/decisions")).json()["decisions"]
    ups = [d for d in decisions if d["kind"] == "scale-up" and d["current"] >= 1]
    downs = [d for d in decisions if d["kind"] == "scale-down"]
    assert ups and all(d["reason"] and d["inputs"]["queue_depth"] is not None for d in ups)
    assert downs and all("low for" in d["reason"] and d["victims"] for d in downs)
    assert min(d["at"] for d in downs) - max(d["at"] for d in ups) >= 4.0  # the stabilisation window held


async def test_a_replica_whose_reports_stop_is_not_counted_as_idle_capacity(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.control_plane, timeout=2, headers=fleet.headers) as cp:
        [victim] = [r["replica"] for r in await replicas(cp) if r["state"] == "ready"]
        pid = agent_pid(fleet, victim)
        os.kill(pid, signal.SIGSTOP)  # the agent freezes: its reports stop, its engine still runs
        try:

            async def flagged() -> bool:
                return any(r["replica"] == victim and r["stale"] for r in await replicas(cp))

            await fleet.until(flagged, timeout_s=15, what=f"{victim} flagged stale")

            async def replaced() -> dict[str, Any] | None:
                # The first such decision: later ones may already count the replacement as capacity.
                decisions = (await cp.get("/v1/decisions")).json()["decisions"]
                ups = [d for d in decisions if d["kind"] == "scale-up" and victim in d["inputs"]["unknown"]]
                return min(ups, key=lambda d: float(d["at"])) if ups else None

            decision = await fleet.until(replaced, timeout_s=15, what="a scale-up replacing the silent replica")
        finally:
            os.kill(pid, signal.SIGCONT)
    assert decision["inputs"]["capacity"] == 0
    assert decision["reason"].startswith("availability")


RUN: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 30, "check": True}


def test_status_and_load_commands_against_the_running_fleet(fleet: Fleet, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "llmfleet.cli"]
    table = subprocess.run([*cli, "status", "--control-plane", fleet.control_plane], **RUN, env=fleet.env).stdout
    assert "pool qwen-7b" in table and "recent decisions:" in table and "scale-up" in table
    raw = subprocess.run(
        [*cli, "status", "--json", "--control-plane", fleet.control_plane], **RUN, env=fleet.env
    ).stdout
    [pool] = json.loads(raw)["pools"]
    assert pool["replica_list"] and pool["replica_list"][0]["engine_url"].startswith("http://127.0.0.1:")
    # Every replica's start, measured by its agent (the simulator logs vLLM's load, compile and graph lines).
    starts = pool["starts"]
    assert starts["count"] >= 1 and starts["cold_start_s"] == 8 and 0 < starts["p50_s"] <= starts["max_s"]
    assert starts["last"]["load_s"] is not None and starts["last"]["ready_s"] > 0
    assert "starts: median" in table and "(coldStartSeconds 8s)" in table, table
    summary = tmp_path / "summary.json"
    done = subprocess.run(
        [*cli, "load", "--rps", "4", "--duration", "1.5", "--gateway", fleet.gateway, "--summary", str(summary)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(summary.read_text())
    assert figures["sent"] == figures["ok"] > 0 and figures["errors"] == {}
    assert "sent" in done.stderr and "TTFT" in done.stderr  # the progress line
    # The engines' prefix-cache hit rate over the agents' window reaches the table once prompts were sent.
    assert "HIT" in table

    def hit_rates() -> list[float] | None:
        argv = [*cli, "status", "--json", "--control-plane", fleet.control_plane]
        raw = subprocess.run(argv, **RUN, env=fleet.env).stdout
        rates = [r["last_report"]["prefix_hit_rate"] for r in json.loads(raw)["pools"][0]["replica_list"]]
        return [r for r in rates if r is not None] or None

    assert all(0.0 <= r <= 1.0 for r in wait_for(hit_rates, timeout_s=15, what="a prefix hit rate in the reports"))


def agent_pid(fleet: Fleet, replica: str) -> int:
    for pid in fleet.tree():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"agent" in argv and replica.encode() in argv:
                return pid
    raise AssertionError(f"no agent process for {replica}")


def test_sigint_stops_everything_and_leaves_no_process(fleet: Fleet) -> None:
    assert len(fleet.tree()) >= 5  # up, control plane, gateway, agents, engines
    code, left = stop_fleet(fleet)
    assert code == 0
    assert left == set()
