"""Rollouts outlive the control plane: a new `Rollouts` over the same store serves the same step, weights and start
times, and the retired baselines; a store that cannot be written is retried. The Kubernetes store runs against a
loopback API server that keeps Lease objects the way the real one does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from control_plane.actuators import ActuatorEnv
from control_plane.rollout_stores import (
    FileRolloutStore,
    KubernetesRolloutStore,
    MemoryRolloutStore,
    RolloutRecord,
    RolloutStore,
    RolloutStoreError,
    build_rollout_store,
)
from control_plane.rollouts import Rollouts
from fleet.protocol.wire import LATENCY_EDGES_S, PoolOutcomes
from fleet.spec.stack import FleetSpec
from tests.support import stacks
from tests.support.kube_api import FakeApiServer, fake_api_server

NS = "llmfleet-prod"
T0 = 1_700_000_000.25
ROLLOUT = {"steps": [10, 50, 100], "bakeS": 3, "minSamples": 1, "tolerance": 0.5, "baselineAfter": "zero"}


def spec() -> FleetSpec:
    return stacks.spec("local-canary", **{"aliases.chat.rollout": ROLLOUT})


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, httpx.AsyncClient]]:
    async with fake_api_server(NS) as served:
        yield served


def step_once(rollouts: Rollouts, now: float) -> None:
    """Both pools answered well since the step began; the tick at ``now`` judges the step on that."""
    counts = [0] * (len(LATENCY_EDGES_S) + 1)
    counts[2] = 10
    for pool in ("qwen-v1", "qwen-v2"):
        rollouts.ledger.record(pool, PoolOutcomes(ok=10, ttft=counts, tpot=counts), now - 0.5)
    rollouts.tick(now)


async def check_resumes(make_store: Callable[[], RolloutStore]) -> None:
    """Shared scenario: started and stepped to 50% by one control plane, the next one serves the same rollout
    and promotes it; the one after that knows the baseline is retired."""
    first = Rollouts(spec(), store=make_store())
    assert await first.restore() == 0
    first.start(first.plan("chat", "qwen-v2"), T0)
    step_once(first, T0 + 4)
    assert await first.save()
    assert first.states["chat"].step == 1

    second = Rollouts(spec(), store=make_store())  # restarted
    assert await second.restore() == 1
    state = second.states["chat"]
    assert (state.step, state.weight, state.started_at, state.step_started_at) == (1, 50, T0, T0 + 4)
    assert second.weights["chat"] == {"qwen-v1": 50, "qwen-v2": 50}
    step_once(second, T0 + 8)  # the bake counts from T0 + 4, when the step began
    assert second.states["chat"].phase.value == "promoted"
    assert await second.save()

    third = Rollouts(spec(), store=make_store())
    await third.restore()
    assert third.retired == {"qwen-v1"} and third.bounds(spec().pool("qwen-v1")).replicas.min == 0


async def test_file_store_keeps_rollouts_across_a_restart(tmp_path: Path) -> None:
    await check_resumes(lambda: FileRolloutStore(tmp_path / "rollouts.json"))
    doc = json.loads((tmp_path / "rollouts.json").read_text())
    assert doc["format"] == 1 and doc["retired"] == ["qwen-v1"]
    assert doc["rollouts"]["chat"]["phase"] == "promoted" and doc["rollouts"]["chat"]["started_at"] == T0


async def test_kubernetes_store_keeps_rollouts_in_one_lease_object(
    api: tuple[FakeApiServer, httpx.AsyncClient],
) -> None:
    server, client = api
    await check_resumes(lambda: KubernetesRolloutStore(client, NS))
    [lease] = server.leases.values()
    assert lease["metadata"]["name"] == "llmfleet-rollouts"
    assert lease["metadata"]["labels"]["llmfleet.io/lease"] == "rollouts"
    assert json.loads(lease["metadata"]["annotations"]["llmfleet.io/rollouts"])["retired"] == ["qwen-v1"]
    assert server.verbs <= {"list", "create", "update"}  # what the control plane's Role grants


async def test_a_hold_is_not_written_but_every_step_is(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.json"
    rollouts = Rollouts(spec(), store=FileRolloutStore(path))
    rollouts.start(rollouts.plan("chat", "qwen-v2"), T0)
    assert rollouts.unsaved and await rollouts.save() and not rollouts.unsaved
    rollouts.tick(T0 + 1)  # baking: a hold
    assert not rollouts.unsaved
    step_once(rollouts, T0 + 4)
    assert rollouts.unsaved


async def test_an_unwritable_store_is_retried_until_it_takes_the_change(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rollouts = Rollouts(spec(), store=FileRolloutStore(blocker / "rollouts.json"))
    rollouts.start(rollouts.plan("chat", "qwen-v2"), T0)
    assert not await rollouts.save() and rollouts.unsaved
    rollouts.store = FileRolloutStore(tmp_path / "rollouts.json")
    assert await rollouts.save() and not rollouts.unsaved


@pytest.mark.parametrize(
    ("text", "message"),
    [("{", "not JSON"), ('{"format": 2, "rollouts": {}}', "not a rollout record"), ("[]", "not a rollout record")],
)
async def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rollouts.json"
    path.write_text(text)
    with pytest.raises(RolloutStoreError, match=message):
        await FileRolloutStore(path).load()


async def test_a_rollout_of_a_pool_the_stack_lost_is_dropped(tmp_path: Path) -> None:
    store = FileRolloutStore(tmp_path / "rollouts.json")
    first = Rollouts(spec(), store=store)
    first.start(first.plan("chat", "qwen-v2"), T0)
    await first.save()
    other = stacks.spec("local-canary", **{"pools.1.name": "qwen-v3", "aliases.chat.pools": {"qwen-v1": 100}})
    second = Rollouts(other, store=store)
    assert await second.restore() == 0 and second.weights["chat"] == {"qwen-v1": 100}


def test_the_store_follows_the_actuator(tmp_path: Path) -> None:
    env = ActuatorEnv(stack="local", control_plane_url="http://unused", state_dir=tmp_path)
    assert isinstance(build_rollout_store(spec(), env, "local"), FileRolloutStore)
    no_dir = ActuatorEnv(stack="local", control_plane_url="http://unused")
    assert isinstance(build_rollout_store(spec(), no_dir, "local"), MemoryRolloutStore)
    assert RolloutRecord().states == {}
