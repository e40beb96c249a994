"""Restart leases outlive the control plane: a new table over the same store holds the same leases, expiring at the
same absolute time; stores that cannot be written grant nothing. The Kubernetes store runs against a loopback
API server that keeps coordination.k8s.io/v1 Lease objects the way the real one does (resourceVersion checks)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.actuators import ActuatorEnv
from control_plane.leases.leases import LeaseRefused, LeaseTable
from control_plane.leases.stores import (
    FileLeaseStore,
    Holders,
    KubernetesLeaseStore,
    LeaseStore,
    LeaseStoreError,
    MemoryLeaseStore,
    build_lease_store,
)
from fleet.protocol.wire import LeaseGrant
from fleet.spec.stack import FleetSpec
from tests.support import stacks
from tests.support.kube_api import FakeApiServer, fake_api_server

POOL = "qwen-7b"
NS = "llmfleet-prod"
T0 = 1_700_000_000.25  # an absolute time with a fraction: expiry must survive to the microsecond


def table(store: LeaseStore) -> LeaseTable:
    return LeaseTable(lambda pool: 1, default_ttl_s=600.0, store=store)


async def grant(leases: LeaseTable, replica: str, now: float, ttl_s: float = 30.5) -> LeaseGrant | LeaseRefused:
    return await leases.acquire_and_save(POOL, replica, now, ttl_s)


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, httpx.AsyncClient]]:
    async with fake_api_server(NS) as served:
        yield served


async def check_survives_a_restart(make_store: Any) -> None:
    """Shared scenario: a lease granted by one table is held by the next one (same expiry), refuses a second
    replica, is released there, and an expired lease is not brought back."""
    first = table(make_store())
    assert await first.restore(T0) == 0
    granted = await grant(first, "a", T0)
    assert isinstance(granted, LeaseGrant) and granted.expires_at == T0 + 30.5

    second = table(make_store())  # the control plane restarted 10 s later
    assert await second.restore(T0 + 10) == 1
    assert second.snapshot(T0 + 10)["holders"] == {POOL: {"a": T0 + 30.5}}
    refused = await grant(second, "b", T0 + 10)
    assert isinstance(refused, LeaseRefused) and refused.holders == ["a"]
    assert await second.release_and_save(POOL, "a", T0 + 11)
    assert isinstance(await grant(second, "b", T0 + 12, ttl_s=5), LeaseGrant)

    third = table(make_store())  # b never released; by T0 + 20 its lease has expired
    assert await third.restore(T0 + 20) == 0
    assert isinstance(await grant(third, "c", T0 + 20), LeaseGrant)


async def test_file_store_keeps_leases_across_a_restart(tmp_path: Path) -> None:
    await check_survives_a_restart(lambda: FileLeaseStore(tmp_path / "leases.json"))
    doc = json.loads((tmp_path / "leases.json").read_text())
    assert doc == {"format": 1, "leases": {POOL: {"c": T0 + 20 + 30.5}}}  # absolute expiry times
    assert [p.name for p in tmp_path.iterdir()] == ["leases.json"]  # no temp file left behind


async def test_kubernetes_store_keeps_leases_as_lease_objects(api: tuple[FakeApiServer, httpx.AsyncClient]) -> None:
    server, client = api
    await check_survives_a_restart(lambda: KubernetesLeaseStore(client, NS))
    [lease] = server.leases.values()
    assert lease["metadata"]["labels"] == {
        "llmfleet.io/lease": "restart",
        "llmfleet.io/pool": POOL,
        "app.kubernetes.io/managed-by": "llmfleet",
    }
    spec = lease["spec"]
    assert spec["holderIdentity"] == "c" and spec["leaseDurationSeconds"] == 31  # whole seconds, rounded up
    renew = datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00")).timestamp()
    assert renew + spec["leaseDurationSeconds"] == pytest.approx(T0 + 20 + 30.5, abs=1e-6)
    assert spec["renewTime"].endswith("Z") and len(spec["renewTime"]) == len("2023-11-14T22:13:20.250000Z")
    # Only what the control plane's Role grants on leases (infra/control_plane_tier.py).
    assert server.verbs <= {"list", "create", "update", "delete"}


async def test_kubernetes_renewal_updates_the_lease_and_a_conflict_grants_nothing(
    api: tuple[FakeApiServer, httpx.AsyncClient],
) -> None:
    server, client = api
    leases = table(KubernetesLeaseStore(client, NS))
    await leases.restore(T0)
    assert isinstance(await grant(leases, "a", T0), LeaseGrant)
    assert isinstance(await grant(leases, "a", T0 + 5), LeaseGrant)  # renewal: the same object, updated
    [lease] = server.leases.values()
    assert lease["metadata"]["resourceVersion"] == "2" and "update" in server.verbs

    class Racing(KubernetesLeaseStore):
        """Someone changes the Lease between this store's read and its write."""

        async def _list(self, selector: str) -> list[dict[str, Any]]:
            listed = await super()._list(selector)
            for item in server.leases.values():
                server._stamp(item)
            return listed

    racing = table(Racing(client, NS))
    await racing.restore(T0 + 6)
    with pytest.raises(LeaseStoreError, match="409"):
        await grant(racing, "a", T0 + 6)
    assert racing.snapshot(T0 + 6)["holders"][POOL] == {"a": T0 + 5 + 30.5}  # the renewal was undone


class Broken(LeaseStore):
    """Reads fine, never writes."""

    def __init__(self, loaded: Holders | None = None) -> None:
        self.loaded = loaded or {}
        self.fail_load = False

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> LeaseStore:
        raise NotImplementedError

    async def load(self) -> Holders:
        if self.fail_load:
            raise LeaseStoreError("unreadable")
        return self.loaded

    async def put(self, pool: str, holders: Mapping[str, float], now: float) -> None:
        raise LeaseStoreError("read-only")


async def test_a_lease_that_cannot_be_saved_is_not_granted() -> None:
    store = Broken()
    leases = table(store)
    store.fail_load = True
    with pytest.raises(LeaseStoreError, match="unreadable"):
        await leases.restore(T0)
    with pytest.raises(LeaseStoreError, match="unreadable"):  # the next call retries the load first
        await grant(leases, "a", T0)
    store.fail_load = False
    with pytest.raises(LeaseStoreError, match="read-only"):
        await grant(leases, "a", T0)
    assert leases.holders(POOL, T0) == []
    assert [e["event"] for e in leases.history] == ["grant", "unsaved"]


async def test_a_release_that_cannot_be_saved_still_frees_the_slot_here() -> None:
    leases = table(Broken({POOL: {"a": T0 + 30}}))
    assert await leases.restore(T0) == 1
    assert await leases.release_and_save(POOL, "a", T0 + 1)  # logged; the stored copy expires on its own
    assert leases.holders(POOL, T0 + 1) == []


@pytest.mark.parametrize(
    ("actuator", "state_dir", "store"),
    [
        ("local", True, FileLeaseStore),
        ("local", False, MemoryLeaseStore),
        ("kubernetes", False, KubernetesLeaseStore),
        ("aws", False, KubernetesLeaseStore),
    ],
)
async def test_the_actuator_chooses_the_store(actuator: str, state_dir: bool, store: type, tmp_path: Path) -> None:
    spec = stacks.spec("aws")
    async with httpx.AsyncClient(base_url="http://127.0.0.1:1") as client:
        env = ActuatorEnv(
            stack="prod",
            control_plane_url="http://unused",
            state_dir=tmp_path if state_dir else None,
            kubernetes_client=client,
        )
        built = build_lease_store(spec, env, actuator)
        assert type(built) is store
        if isinstance(built, FileLeaseStore):
            assert built.path == tmp_path / "leases.json"
        if isinstance(built, KubernetesLeaseStore):
            assert built.namespace == spec.cluster.namespace
