"""Lease stores: where restart leases outlive the control plane that granted them, one class per store.

    load() -> {pool: {replica: expires_at}}          every lease the store holds (expired ones included)
    put(pool, holders, now) -> None                    make the store hold exactly ``holders`` for ``pool``

Expiry times are absolute (seconds since the epoch, the control plane's wall clock), never "TTL left", so a lease
granted before a restart expires at the same instant after it. `control_plane.leases.leases.LeaseTable` decides; a store
only keeps its decisions. A store that cannot be read or written raises `LeaseStoreError` (retryable): the table
then grants nothing rather than a lease it could forget.

The actuator names its store (`control_plane.actuators.Actuator.lease_store`), so the choice follows the target:

* ``kubernetes`` (actuators ``kubernetes`` and ``aws``): one ``coordination.k8s.io/v1`` Lease per holder in the
  fleet's namespace, labelled ``llmfleet.io/lease: restart`` and ``llmfleet.io/pool: P``, ``holderIdentity`` the
  replica. ``renewTime + leaseDurationSeconds`` is the expiry to the microsecond (the duration is whole seconds,
  so ``renewTime`` is set that far before the expiry). ``kubectl get leases -l llmfleet.io/lease=restart`` lists
  the holders. Uses list, create, update and delete on leases (the control plane's Role grants just those).
* ``file`` (actuator ``local``): ``<state dir>/leases.json``, rewritten atomically (`control_plane.statefile`) on
  every change. Chosen over Redis because the local fleet runs no Redis, one control plane owns the file, and a
  rename is all the atomicity it needs. Without a state dir it falls back to ``memory`` (and says so).
* ``memory``: nothing persists (tests, dry runs without a state dir).
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import logging
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import httpx

from control_plane.actuators import REGISTRY as ACTUATORS, ActuatorEnv
from control_plane.leases.lease_api import KIND_LABEL, LeaseApi
from control_plane.statefile import StateFileError, read_json, write_json
from fleet.protocol.contract import LABEL_POOL
from fleet.spec.stack import FleetSpec

__all__ = [
    "STORES",
    "FileLeaseStore",
    "Holders",
    "KubernetesLeaseStore",
    "LeaseStore",
    "LeaseStoreError",
    "MemoryLeaseStore",
    "build_lease_store",
]

log = logging.getLogger("llmfleet.autoscaler.leases")

Holders = dict[str, dict[str, float]]  # pool -> replica -> expires_at (seconds since the epoch)
STORES: dict[str, type[LeaseStore]] = {}


class LeaseStoreError(RuntimeError):
    """The store could not be read or written (retryable: the next lease call tries again)."""


class LeaseStore(abc.ABC):
    name: ClassVar[str]

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
            STORES[name] = cls

    @classmethod
    @abc.abstractmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> LeaseStore: ...

    @abc.abstractmethod
    async def load(self) -> Holders: ...

    @abc.abstractmethod
    async def put(self, pool: str, holders: Mapping[str, float], now: float) -> None: ...

    def where(self) -> str:
        """Where the leases live, for the log."""
        return self.name

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; default: nothing."""


def build_lease_store(spec: FleetSpec, env: ActuatorEnv, actuator: str) -> LeaseStore:
    """The store the actuator named ``actuator`` keeps its fleet's leases in."""
    return STORES[ACTUATORS.get(actuator).lease_store].from_env(spec, env)


class MemoryLeaseStore(LeaseStore, name="memory"):
    """Keeps nothing: leases live as long as the process."""

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> LeaseStore:
        del spec, env  # Unused.
        return cls()

    async def load(self) -> Holders:
        return {}

    async def put(self, pool: str, holders: Mapping[str, float], now: float) -> None:
        del pool, holders, now  # Unused.


class FileLeaseStore(LeaseStore, name="file"):
    """``{"format": 1, "leases": {pool: {replica: expires_at}}}`` in one file, replaced atomically."""

    FILE = "leases.json"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._holders: Holders = {}

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> LeaseStore:
        del spec  # Unused.
        if env.state_dir is None:
            log.warning("no state dir: restart leases are kept in memory and forgotten if the control plane restarts")
            return MemoryLeaseStore()
        return cls(env.state_dir / cls.FILE)

    def where(self) -> str:
        return f"file {self.path}"

    async def load(self) -> Holders:
        try:
            doc = await asyncio.to_thread(read_json, self.path)
        except StateFileError as exc:
            raise LeaseStoreError(str(exc)) from exc
        if doc is None:
            self._holders = {}
        elif not isinstance(doc, dict) or doc.get("format") != 1 or not isinstance(doc.get("leases"), dict):
            raise LeaseStoreError(f"{self.path}: not a lease file of format 1; move it away to start without it")
        else:
            leases: dict[str, Any] = doc["leases"]
            self._holders = {
                pool: {str(r): float(at) for r, at in held.items()} for pool, held in leases.items() if held
            }
        return {pool: dict(held) for pool, held in self._holders.items()}

    async def put(self, pool: str, holders: Mapping[str, float], now: float) -> None:
        del now  # Unused: expiry times are stored as they are.
        updated = {**self._holders, pool: dict(holders)}
        doc = {"format": 1, "leases": {p: held for p, held in sorted(updated.items()) if held}}
        try:
            await asyncio.to_thread(write_json, self.path, doc)
        except StateFileError as exc:
            raise LeaseStoreError(str(exc)) from exc
        self._holders = {p: held for p, held in updated.items() if held}


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,240}[a-z0-9])?$")


def lease_name(pool: str, replica: str) -> str:
    """The Lease object of ``replica``'s restart lease: readable when the replica id allows, else hashed."""
    readable = f"llmfleet-restart-{pool}-{replica}"
    if _DNS_SUBDOMAIN.match(readable):
        return readable
    return f"llmfleet-restart-{pool}-{hashlib.sha256(replica.encode()).hexdigest()[:16]}"


def _micro_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(micro_time: str) -> float:
    return datetime.fromisoformat(micro_time.replace("Z", "+00:00")).timestamp()


def _expiry(lease: Mapping[str, Any]) -> float:
    spec = lease["spec"]
    return _epoch(spec["renewTime"]) + float(spec["leaseDurationSeconds"])


class KubernetesLeaseStore(LeaseStore, name="kubernetes"):
    """One Lease object per holder (see the module docstring), through the API server's REST interface."""

    def __init__(self, client: httpx.AsyncClient, namespace: str, owns_client: bool = False) -> None:
        self.api = LeaseApi(client, namespace, LeaseStoreError, owns_client)
        self.namespace = namespace

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> LeaseStore:
        api = LeaseApi.from_env(spec, env, LeaseStoreError)
        return cls(api.client, api.namespace, api.owns_client)

    def where(self) -> str:
        return f"Lease objects in namespace {self.namespace}"

    async def _list(self, selector: str) -> list[dict[str, Any]]:
        items = await self.api.list(selector)
        return [i for i in items if i.get("spec", {}).get("holderIdentity") and i["spec"].get("renewTime")]

    async def load(self) -> Holders:
        out: Holders = {}
        for lease in await self._list(f"{KIND_LABEL}=restart"):
            pool = lease["metadata"].get("labels", {}).get(LABEL_POOL)
            if pool:
                out.setdefault(pool, {})[lease["spec"]["holderIdentity"]] = _expiry(lease)
        return out

    async def put(self, pool: str, holders: Mapping[str, float], now: float) -> None:
        listed = await self._list(f"{KIND_LABEL}=restart,{LABEL_POOL}={pool}")
        existing = {lease["spec"]["holderIdentity"]: lease for lease in listed}
        for replica, gone in existing.items():
            if replica not in holders:
                await self.api.call("DELETE", f"{self.api.path}/{gone['metadata']['name']}", ok=(404,))
        for replica, expires_at in holders.items():
            previous = existing.get(replica)
            if previous is None:
                await self.api.call("POST", self.api.path, json=self._lease(pool, replica, expires_at, now, None))
            elif abs(_expiry(previous) - expires_at) >= 1e-3:
                body = self._lease(pool, replica, expires_at, now, previous)
                await self.api.call("PUT", f"{self.api.path}/{previous['metadata']['name']}", json=body)

    def _lease(
        self, pool: str, replica: str, expires_at: float, now: float, previous: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        duration = max(1, math.ceil(expires_at - now))
        metadata: dict[str, Any] = {
            "name": previous["metadata"]["name"] if previous else lease_name(pool, replica),
            "namespace": self.namespace,
            "labels": self.api.labels("restart", **{LABEL_POOL: pool}),
        }
        if previous is not None:  # optimistic concurrency: the update fails if someone else changed the Lease
            metadata["resourceVersion"] = previous["metadata"]["resourceVersion"]
        acquired = previous["spec"].get("acquireTime") if previous else None
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": replica,
                "leaseDurationSeconds": duration,
                "acquireTime": acquired or _micro_time(now),
                "renewTime": _micro_time(expires_at - duration),
            },
        }

    async def close(self) -> None:
        await self.api.close()
