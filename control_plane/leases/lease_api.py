"""LeaseApi: the API server's Lease objects in one namespace, over its REST interface, for the stores that keep the
control plane's state in them (restart leases, `control_plane.leases.stores`; rollouts, `control_plane.rollout_stores`).

Every object it makes carries ``KIND_LABEL`` (``restart``, ``rollouts``) so each store lists only its own, and
``app.kubernetes.io/managed-by: llmfleet``. A call that fails (transport error, or an HTTP status of 400 or more
that the caller did not name as fine) raises the store's own error type, naming the method, path and answer.
"""

from __future__ import annotations

from typing import Any

import httpx

from control_plane.actuators import ActuatorEnv
from control_plane.actuators.kubernetes import in_cluster_client
from fleet.spec.stack import FleetSpec

__all__ = ["KIND_LABEL", "LeaseApi"]

KIND_LABEL = "llmfleet.io/lease"


class LeaseApi:
    def __init__(
        self, client: httpx.AsyncClient, namespace: str, error: type[Exception], owns_client: bool = False
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.error = error
        self.owns_client = owns_client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    @classmethod
    def from_env(cls, spec: FleetSpec, env: ActuatorEnv, error: type[Exception]) -> LeaseApi:
        """The actuator's client when it has one (tests, a shared connection pool), else the pod's own."""
        if env.kubernetes_client is not None:
            return cls(env.kubernetes_client, spec.cluster.namespace, error)
        return cls(in_cluster_client(), spec.cluster.namespace, error, owns_client=True)

    def labels(self, kind: str, **more: str) -> dict[str, str]:
        return {KIND_LABEL: kind, **more, "app.kubernetes.io/managed-by": "llmfleet"}

    async def call(self, method: str, path: str, ok: tuple[int, ...] = (), **kwargs: Any) -> dict[str, Any]:
        try:
            response = await self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self.error(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400 and response.status_code not in ok:
            raise self.error(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
        body: dict[str, Any] = response.json() if response.content else {}
        return body

    async def list(self, selector: str) -> list[dict[str, Any]]:
        """The Lease objects matching the label ``selector``."""
        listing = await self.call("GET", self.path, params={"labelSelector": selector})
        items: list[dict[str, Any]] = listing.get("items") or []
        return items

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()
