"""``llmfleet up`` on the real vLLM: the local fleet with two real engines, its banner, the `openai` client's
stream, ``llmfleet status``, and a restart window taken under steady load without a failed request.

The stack is the shipped ``local-vllm`` with two replicas and a restart window that opened a minute ago; a replica
is due once its engine has run 3 minutes (``minUptimeHours`` 0.05, counted from its launch), time enough for both
to start and for the first tests to run. At most one replica of the pool restarts at a time (``maxUnavailable``
1): each drains, its engine starts again, and only then is its lease released.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
import pytest

from control_plane.actuators.local_state import pid_alive
from fleet.protocol.keys import DEMO_API_KEY
from tests.llmfleet.local.conftest import Fleet, read_until_up, start_fleet, stop_fleet
from tests.support.wait import wait_for
from tests.vllm.conftest import SERVED, START_S, vllm_stack
from tests.vllm.streams import SteadyLoad

RUN: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60, "check": True}


def _window_open_since_a_minute() -> dict[str, Any]:
    start = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%H:%M:%S")
    return {"enabled": True, "start": start, "durationMinutes": 60, "timezone": "UTC", "minUptimeHours": 0.05,
            "maxUnavailable": 1}  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("up")
    stack = vllm_stack(
        tmp / "Pulumi.vllm-up.yaml",
        **{"pools.0.replicas": {"min": 2, "max": 2}, "pools.0.restartWindow": _window_open_since_a_minute()},
    )
    running = start_fleet(stack, tmp / "logs", "--ready-timeout", str(int(2 * START_S)), "--no-prometheus")
    try:
        read_until_up(running, timeout_s=2 * START_S)
        yield running
    finally:
        tree = running.tree()
        stop_fleet(running, timeout_s=90)
        for pid in {p for p in tree if pid_alive(p)}:  # never leave an engine behind, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        running.up.kill()


def test_up_serves_the_openai_clients_stream_from_real_engines(fleet: Fleet) -> None:
    banner = fleet.output[0]
    assert fleet.gateway in banner and DEMO_API_KEY in banner
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key=DEMO_API_KEY, max_retries=0, timeout=60)
    chunks = list(client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "Hello!"}],
                                                 max_tokens=16, stream=True))  # fmt: skip
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_status_shows_both_real_engines_ready_with_their_version(fleet: Fleet) -> None:
    cli = [sys.executable, "-m", "llmfleet.cli", "status", "--control-plane", fleet.control_plane]
    table = subprocess.run(cli, **RUN, env=fleet.env).stdout
    assert "pool qwen-7b" in table

    def both_ready() -> dict[str, Any] | None:  # a slow machine may have begun a planned restart already
        [pool] = json.loads(subprocess.run([*cli, "--json"], **RUN, env=fleet.env).stdout)["pools"]
        listed = pool["replica_list"]
        return pool if len(listed) == 2 and {r["state"] for r in listed} == {"ready"} else None

    pool = wait_for(both_ready, timeout_s=START_S, interval_s=1, what="both replicas ready in llmfleet status")
    assert pool["starts"]["count"] >= 2 and pool["starts"]["last"]["ready_s"] > 0


async def test_the_restart_window_restarts_both_real_engines_in_turn_under_load_without_a_failed_request(
    fleet: Fleet,
) -> None:
    originals = sorted(r["replica"] for r in fleet.replicas())
    async with SteadyLoad(fleet.gateway, clients=3) as load:
        await fleet.until_restarted(originals, timeout_s=4 * START_S)
    assert sorted(r["replica"] for r in fleet.replicas() if r["state"] == "ready") == originals  # not replaced
    assert load.failures == [], load.failures
    assert load.ok > 0


def test_sigint_stops_the_fleet_and_every_engine(fleet: Fleet) -> None:
    tree = fleet.tree()
    code, left = stop_fleet(fleet, timeout_s=90)
    assert code == 0 and not left, (code, left, fleet.logs())
    assert not any(pid_alive(pid) for pid in tree)
