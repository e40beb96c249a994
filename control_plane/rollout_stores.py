"""Rollout stores: where canary rollouts outlive the control plane that runs them, one class per store.

    load() -> RolloutRecord | None     what the store holds (None: nothing yet)
    save(record) -> None               make the store hold ``record``

A record is every alias's rollout (running, or the last finished: its plan, phase, step, when it started and when
its current step began) and the baselines promoted away from (`control_plane.rollouts.Rollouts.retired`). Times
are absolute (seconds since the epoch, the control plane's wall clock), so a restarted control plane judges the
step it finds on the window since that step began, not since the restart. A store that cannot be read or written
raises `RolloutStoreError` (retryable: `Rollouts` writes again on the next tick until it succeeds).

The actuator's ``lease_store`` names the store, as for restart leases (`control_plane.leases.stores`):

* ``kubernetes``: one ``coordination.k8s.io/v1`` Lease, ``llmfleet-rollouts``, in the fleet's namespace, labelled
  ``llmfleet.io/lease: rollouts``; the record is its ``llmfleet.io/rollouts`` annotation (JSON), ``holderIdentity``
  ``control-plane``. ``kubectl get lease llmfleet-rollouts -o yaml`` shows it. Written with the Lease verbs the
  control plane's Role already grants (list, create, update), an update carrying the ``resourceVersion`` read.
* ``file``: ``<state dir>/rollouts.json``, rewritten atomically (`control_plane.statefile`). Without a state dir it
  falls back to ``memory`` (and says so).
* ``memory``: nothing persists.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from control_plane.actuators import REGISTRY as ACTUATORS, ActuatorEnv
from control_plane.leases.lease_api import KIND_LABEL, LeaseApi
from control_plane.statefile import StateFileError, read_json, write_json
from fleet.spec.stack import FleetSpec
from rollout.canary import CanaryPlan, CanaryState, Phase

__all__ = [
    "ROLLOUT_STORES",
    "FileRolloutStore",
    "KubernetesRolloutStore",
    "MemoryRolloutStore",
    "RolloutRecord",
    "RolloutStore",
    "RolloutStoreError",
    "build_rollout_store",
    "decode",
    "encode",
]

log = logging.getLogger("llmfleet.control_plane.rollouts")

FORMAT = 1
ROLLOUT_STORES: dict[str, type[RolloutStore]] = {}


class RolloutStoreError(RuntimeError):
    """The store could not be read or written, or holds something that is not a rollout record (the message says
    where)."""


@dataclass(frozen=True)
class RolloutRecord:
    """What a store keeps: alias -> its rollout, and the pools whose ``replicas.min`` is read as 0."""

    states: dict[str, CanaryState] = field(default_factory=dict)
    retired: frozenset[str] = frozenset()


def encode(record: RolloutRecord) -> dict[str, Any]:
    """``record`` as a JSON document (format 1)."""
    rollouts = {}
    for alias, state in sorted(record.states.items()):
        plan = {**asdict(state.plan), "steps": list(state.plan.steps), "metrics": list(state.plan.metrics)}
        rollouts[alias] = {
            "plan": plan,
            "phase": state.phase.value,
            "step": state.step,
            "started_at": state.started_at,
            "step_started_at": state.step_started_at,
            "reason": state.reason,
        }
    return {"format": FORMAT, "rollouts": rollouts, "retired": sorted(record.retired)}


def decode(doc: Any, where: str) -> RolloutRecord:
    """The record in ``doc``; RolloutStoreError naming ``where`` when it is not one."""
    try:
        if doc["format"] != FORMAT:
            raise ValueError(f"format {doc['format']!r}")
        states = {}
        for alias, entry in doc["rollouts"].items():
            raw = dict(entry["plan"])
            plan = CanaryPlan(**{**raw, "steps": tuple(raw["steps"]), "metrics": tuple(raw["metrics"])})
            states[str(alias)] = CanaryState(
                plan,
                Phase(entry["phase"]),
                int(entry["step"]),
                float(entry["started_at"]),
                float(entry["step_started_at"]),
                str(entry.get("reason", "")),
            )
        return RolloutRecord(states, frozenset(str(p) for p in doc.get("retired", ())))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RolloutStoreError(f"{where}: not a rollout record ({exc}); move it away to start without it") from exc


class RolloutStore(abc.ABC):
    name: ClassVar[str]

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
            ROLLOUT_STORES[name] = cls

    @classmethod
    @abc.abstractmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> RolloutStore: ...

    @abc.abstractmethod
    async def load(self) -> RolloutRecord | None: ...

    @abc.abstractmethod
    async def save(self, record: RolloutRecord) -> None: ...

    def where(self) -> str:
        """Where the rollouts live, for the log."""
        return self.name

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; default: nothing."""


def build_rollout_store(spec: FleetSpec, env: ActuatorEnv, actuator: str) -> RolloutStore:
    """The store the actuator named ``actuator`` keeps its fleet's rollouts in (the one its leases use)."""
    return ROLLOUT_STORES[ACTUATORS.get(actuator).lease_store].from_env(spec, env)


class MemoryRolloutStore(RolloutStore, name="memory"):
    """Keeps nothing: rollouts live as long as the process."""

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> RolloutStore:
        del spec, env  # Unused.
        return cls()

    async def load(self) -> RolloutRecord | None:
        return None

    async def save(self, record: RolloutRecord) -> None:
        del record  # Unused.


class FileRolloutStore(RolloutStore, name="file"):
    """``<state dir>/rollouts.json``, replaced atomically."""

    FILE = "rollouts.json"

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> RolloutStore:
        del spec  # Unused.
        if env.state_dir is None:
            log.warning("no state dir: rollouts are kept in memory and forgotten if the control plane restarts")
            return MemoryRolloutStore()
        return cls(env.state_dir / cls.FILE)

    def where(self) -> str:
        return f"file {self.path}"

    async def load(self) -> RolloutRecord | None:
        try:
            doc = await asyncio.to_thread(read_json, self.path)
        except StateFileError as exc:
            raise RolloutStoreError(str(exc)) from exc
        return None if doc is None else decode(doc, str(self.path))

    async def save(self, record: RolloutRecord) -> None:
        try:
            await asyncio.to_thread(write_json, self.path, encode(record))
        except StateFileError as exc:
            raise RolloutStoreError(str(exc)) from exc


ANNOTATION = "llmfleet.io/rollouts"
LEASE_NAME = "llmfleet-rollouts"


class KubernetesRolloutStore(RolloutStore, name="kubernetes"):
    """One Lease object holding the record in an annotation (see the module docstring)."""

    def __init__(self, client: httpx.AsyncClient, namespace: str, owns_client: bool = False) -> None:
        self.api = LeaseApi(client, namespace, RolloutStoreError, owns_client)
        self.namespace = namespace

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv) -> RolloutStore:
        api = LeaseApi.from_env(spec, env, RolloutStoreError)
        return cls(api.client, api.namespace, api.owns_client)

    def where(self) -> str:
        return f"Lease {LEASE_NAME} in namespace {self.namespace}"

    async def _find(self) -> dict[str, Any] | None:
        listing = await self.api.list(f"{KIND_LABEL}=rollouts")
        found = [i for i in listing if i.get("metadata", {}).get("name") == LEASE_NAME]
        return found[0] if found else None

    async def load(self) -> RolloutRecord | None:
        lease = await self._find()
        text = None if lease is None else (lease["metadata"].get("annotations") or {}).get(ANNOTATION)
        if text is None:
            return None
        where = f"Lease {LEASE_NAME} annotation {ANNOTATION}"
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise RolloutStoreError(f"{where} is not JSON ({exc})") from exc
        return decode(doc, where)

    async def save(self, record: RolloutRecord) -> None:
        previous = await self._find()
        metadata: dict[str, Any] = {
            "name": LEASE_NAME,
            "namespace": self.namespace,
            "labels": self.api.labels("rollouts"),
            "annotations": {ANNOTATION: json.dumps(encode(record), sort_keys=True)},
        }
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {"holderIdentity": "control-plane"},
        }
        if previous is None:
            await self.api.call("POST", self.api.path, json=body)
            return
        # Optimistic concurrency: the update fails if someone else changed the Lease since it was read.
        metadata["resourceVersion"] = previous["metadata"]["resourceVersion"]
        await self.api.call("PUT", f"{self.api.path}/{LEASE_NAME}", json=body)

    async def close(self) -> None:
        await self.api.close()
