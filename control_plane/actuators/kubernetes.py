"""KubernetesActuator (``kubernetes``): scale a pool's Deployment through its ``scale`` subresource.

    GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale     autoscaling/v1 Scale -> current target
    PATCH /api/v1/namespaces/{ns}/pods/{victim}                      pod-deletion-cost annotation (scale-down)
    PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale     {"spec": {"replicas": N}} (merge patch)

    GET   /api/v1/namespaces/{ns}/pods/{name}                         the pod's IP (sleep mode: its agent)
    POST  http://{pod IP}:8000/sleep | /wake                          the agent (sleep mode)

On scale-down the victims (least-loaded first, chosen by the loop) get
``controller.kubernetes.io/pod-deletion-cost: "-1000"`` before the replica count drops, so the ReplicaSet
deletes exactly them; each victim's agent then drains on SIGTERM (leaves rotation, finishes in-flight requests)
inside the pod's termination grace period. The HTTP client is injected (``env.kubernetes_client``: an
``httpx.AsyncClient`` whose base_url is the API server); by default the in-cluster service account is used.

**Sleep mode** (``engine.sleepMode``). A scale-down's ``sleep`` replicas are not stopped: their agents get
``POST /sleep`` (at the pod's IP, with the control plane's credential, as the network policy admits) and keep
their pods, and a scale-up first sends ``POST /wake`` to its ``wake`` replicas. The Deployment's count is what
holds a GPU (`Decision.holding`: the awake target plus the sleeping), so the ReplicaSet deletes exactly the
drained victims, never a sleeping pod. A refused or unreachable agent is logged; the next tick sees the state
its agent reports and decides again.

The Deployment of pool ``P`` is `fleet.protocol.contract.pool_deployment_name` (``llmfleet-P``, the name the Pulumi
program gives it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from control_plane.actuators import Actuator, ActuatorEnv, FleetView
from control_plane.scaling.decisions import Decision, ScaleDown, ScaleUp
from fleet.protocol.contract import AGENT_PORT, pool_deployment_name
from fleet.protocol.control_auth import BearerAuth, ClientCredential, Kind
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["DELETION_COST", "MERGE_PATCH", "KubernetesActuator", "KubernetesError", "in_cluster_client"]

log = logging.getLogger("llmfleet.autoscaler.actuators")

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


class KubernetesError(RuntimeError):
    """The API server refused a request (status and body in the message)."""


def in_cluster_client(
    account_dir: Path = _SA,
    env: Mapping[str, str] = os.environ,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """A client for the API server from the pod's service account (KUBERNETES_SERVICE_HOST/PORT).

    The token is read on each request from ``account_dir/token`` (again only when its modification time or size
    changed): kubelet rotates projected tokens hourly, and the API server rejects a token older than its extended
    90-day validity, so a token read once at start breaks scaling and leases on a long-running control plane.
    ``transport`` replaces the TLS transport (tests); the CA is then not loaded.
    """
    host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
    # Kind is unused for a raw token file: the file's content is presented as read.
    credential = ClientCredential(Kind.CONTROL_PLANE, path=account_dir / "token", raw=True)
    return httpx.AsyncClient(
        base_url=f"https://{host}:{port}",
        auth=BearerAuth(credential),
        verify=str(account_dir / "ca.crt") if transport is None else True,
        transport=transport,
        timeout=10.0,
    )


class KubernetesActuator(Actuator, name="kubernetes"):
    lease_store = "kubernetes"  # restart leases as Lease objects in the fleet's namespace

    def __init__(
        self,
        spec: FleetSpec,
        client: httpx.AsyncClient,
        deployment_name: Callable[[str], str] = pool_deployment_name,
        agents: httpx.AsyncClient | None = None,
        agent_port: int = AGENT_PORT,
    ) -> None:
        self.spec = spec
        self.client = client
        self.namespace = spec.cluster.namespace
        self.deployment_name = deployment_name
        self.agent_port = agent_port
        # POST /sleep and /wake need the control plane's credential, as /drain does.
        credential = ClientCredential.from_env(Kind.CONTROL_PLANE)
        self.agents = agents or httpx.AsyncClient(timeout=5.0, auth=BearerAuth(credential) if credential else None)

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        return cls(spec, env.kubernetes_client or in_cluster_client())

    def _scale_path(self, pool: str) -> str:
        name = self.deployment_name(pool)
        return f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}/scale"

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self.client.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise KubernetesError(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
        body: dict[str, Any] = response.json()
        return body

    async def current(self, pool: PoolSpec) -> FleetView:
        scale = await self._call("GET", self._scale_path(pool.name))
        return FleetView(int(scale.get("spec", {}).get("replicas", 0)))

    async def apply(self, decision: Decision) -> None:
        if isinstance(decision, ScaleUp):
            for replica in decision.wake:
                await self._command(replica, "/wake")
        if isinstance(decision, ScaleDown):
            for victim in decision.victims:
                if victim.startswith("pending-"):
                    continue  # a placeholder for a pod not reporting yet: the ReplicaSet picks unready pods first
                patch = {"metadata": {"annotations": {DELETION_COST: "-1000"}}}
                await self._call("PATCH", self._pod_path(victim), json=patch, headers=MERGE_PATCH)
            for replica in decision.sleep:
                await self._command(replica, "/sleep")
        body = {"spec": {"replicas": decision.holding}}
        await self._call("PATCH", self._scale_path(decision.pool), json=body, headers=MERGE_PATCH)

    def _pod_path(self, pod: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{pod}"

    async def _command(self, pod: str, path: str) -> None:
        """``POST path`` (``/sleep``, ``/wake``) on the agent of ``pod``, found by the pod's IP. A failure is
        logged, not raised: the replica count still follows, and the next tick sees what the agent reports."""
        try:
            ip = (await self._call("GET", self._pod_path(pod))).get("status", {}).get("podIP")
            if not ip:
                log.warning("%s %s: the pod has no IP yet", path, pod)
                return
            response = await self.agents.post(f"http://{ip}:{self.agent_port}{path}")
        except (KubernetesError, httpx.HTTPError) as exc:
            log.warning("%s %s: %s", path, pod, exc)
            return
        if response.status_code >= 300:
            log.warning("%s %s refused: %s %s", path, pod, response.status_code, response.text[:200])

    async def close(self) -> None:
        await self.client.aclose()
        await self.agents.aclose()
