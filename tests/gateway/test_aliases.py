"""An alias through the gateway, with the openai client: its sessions split by weight and each keeps its pool;
a pool without a ready replica hands its sessions to the fallback, then to the other weighted pool; a new table
replaces the stack's at runtime.

Three simulator processes, one per pool, each serving its pool's name, so an answer's ``model`` says which pool
really served it. The expected pool of every session comes from `AliasTable`, the function the gateway runs.
"""

from __future__ import annotations

import collections
import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import httpx
import openai
import pytest

from fleet.protocol import promtext
from gateway.endpoints import static_replica_id
from gateway.routing.aliases import AliasTable, WeightedAlias
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from tests.gateway.builders import request
from tests.gateway.conftest import SimFactory, serve_with_admin
from tests.support.procs import Proc
from tests.support.stacks import KEYS, spec
from tests.support.wait import async_wait_for

WEIGHTS = {"qwen-v1": 70, "qwen-v2": 30}
SESSIONS = 40


def _pool(name: str) -> dict[str, Any]:
    engine = {"kind": "sim", "maxNumSeqs": 8, "maxModelLen": 8192}
    return {"name": name, "model": "Qwen/Qwen2.5-7B-Instruct", "servedModelName": name, "engine": engine}


def _settings(sims: Sequence[Proc]) -> GatewaySettings:
    names = ["qwen-v1", "qwen-v2", "qwen-small"]
    stack = spec(
        "gateway",
        pools=[_pool(name) for name in names],
        aliases={"chat": {"pools": WEIGHTS, "fallback": "qwen-small"}},
        **{"tenants.1.allowedModels": ["chat"]},
    )
    replicas = {name: [sim.url] for name, sim in zip(names, sims, strict=True)}
    return GatewaySettings(spec=stack, static_replicas=replicas, access_log=True, routing_seed=3)


def _expected(sessions: Sequence[str], settings: GatewaySettings) -> dict[str, str]:
    table = AliasTable.from_spec(settings.spec.aliases)
    alias = table.aliases["chat"]
    return {sid: table.resolve(alias, request(session_id=sid), lambda pool: True) for sid in sessions}


async def _ask(client: openai.AsyncOpenAI, session: str, turn: int) -> tuple[str, str]:
    """One turn of ``session`` through the alias: (the answer's model, the replica that served it)."""
    raw = await client.chat.completions.with_raw_response.create(
        model="chat",
        messages=[{"role": "user", "content": f"turn {turn} of {session}"}],
        max_tokens=2,
        extra_headers={"x-session-id": session},
    )
    return raw.parse().model, raw.headers["x-llmfleet-replica"]


async def _routable(gateway: Gateway, pool: str, count: int) -> bool:
    return gateway.endpoints.routable(pool) == count


async def test_an_alias_splits_sessions_by_weight_keeps_each_on_its_pool_and_falls_back(
    sims: SimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    v1, v2, small = sims(*(["--served-model-name", name] for name in ("qwen-v1", "qwen-v2", "qwen-small")))
    settings = _settings([v1, v2, small])
    sessions = [f"conversation-{i}" for i in range(SESSIONS)]
    expected = _expected(sessions, settings)
    caplog.set_level(logging.INFO, logger="llmfleet.gateway.access")
    async with serve_with_admin(settings) as (url, admin, gateway):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["bronze"], max_retries=0)
        try:
            listed = {m.id for m in (await client.models.list()).data}
            assert listed == {"chat"}  # bronze may use the alias, not its pools by name

            served: dict[str, set[str]] = collections.defaultdict(set)
            for turn in range(2):
                for sid in sessions:
                    model, replica = await _ask(client, sid, turn)
                    assert replica == static_replica_id(model, 0)  # the pool named is the pool that served
                    served[sid].add(model)
            assert all(len(models) == 1 for models in served.values()), dict(served)  # sticky
            assert {sid: models.pop() for sid, models in served.items()} == expected
            canary = sum(1 for pool in expected.values() if pool == "qwen-v2")
            assert abs(canary - SESSIONS * 0.3) <= 3 * math.sqrt(SESSIONS * 0.3 * 0.7)

            async with httpx.AsyncClient() as http:  # the admin port
                samples = promtext.parse((await http.get(admin + "/metrics")).text)
            routed = {s.labels["pool"]: s.value for s in samples["llmfleet_gateway_alias_routed_total"]}
            assert routed == {pool: 2.0 * n for pool, n in collections.Counter(expected.values()).items()}

            # A new table replaces the stack's at runtime: all of the alias's sessions to the canary, at once.
            gateway.set_aliases(AliasTable({"chat": WeightedAlias("chat", {"qwen-v1": 0, "qwen-v2": 1})}))
            assert any(expected[sid] == "qwen-v1" for sid in sessions[:8])
            assert {(await _ask(client, sid, 9))[0] for sid in sessions[:8]} == {"qwen-v2"}
            with pytest.raises(ValueError, match="unknown pools"):
                gateway.set_aliases(AliasTable({"chat": WeightedAlias("chat", {"qwen-v9": 1})}))
            gateway.set_aliases(AliasTable.from_spec(settings.spec.aliases))

            # The canary's simulator stops: its sessions go to the fallback, the others stay where they were.
            v2.stop()
            await async_wait_for(lambda: _routable(gateway, "qwen-v2", 0), timeout_s=20, what="qwen-v2 unready")
            for sid in sessions:
                model, _ = await _ask(client, sid, 2)
                assert model == ("qwen-small" if expected[sid] == "qwen-v2" else expected[sid]), sid

            # And with the fallback gone too, they go to the other weighted pool.
            small.stop()
            await async_wait_for(lambda: _routable(gateway, "qwen-small", 0), timeout_s=20, what="fallback unready")
            moved = [sid for sid in sessions if expected[sid] == "qwen-v2"]
            assert {(await _ask(client, sid, 3))[0] for sid in moved} == {"qwen-v1"}
        finally:
            await client.close()

    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "llmfleet.gateway.access"]
    first = next(line for line in logged if line["status"] == 200)
    assert first["alias"] == "chat"
    assert first["pool"] == expected[sessions[0]] == first["model"]
    assert first["replica"] == static_replica_id(first["pool"], 0)
