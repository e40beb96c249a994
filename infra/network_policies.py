"""Network policies: ingress to the fleet's pods is denied unless a rule below lets it in.

* ``default-deny``: every pod of the namespace, no ingress rule. A pod that no other policy selects takes no
  connection at all.
* engines (``component: engine``): the vLLM port (8001) from gateway pods and the Prometheus scraper; the agent
  port (8000) from gateway pods, the control plane and the scraper; where a pool publishes KV-cache events
  (``engine.kvEvents``), their port (5557) from gateway pods only; where a pool runs prefill and decode apart
  (``disaggregation``), NIXL's side channel (``disaggregation.sideChannelPort``) from engine pods: a decode engine
  opens it on the prefill engine to fetch the KV cache's metadata (one listener per engine, on the port plus the
  data-parallel index, which is 0 here: vllm@4ba787ec9:vllm/distributed/kv_transfer/kv_connector/v1/nixl/
  base_scheduler.py:77-80) (EFA's own traffic bypasses the kernel and is
  governed by the EFA security group, `infra.efa_cloud`, not by NetworkPolicy).
* the control plane: its port from agents (engine pods), gateways and the scraper.
* the gateway: its port from anywhere, as the public entry that authenticates every request itself; its admin port
  (/readyz, /metrics) from the scraper only.
* the in-cluster quota Redis (``kubernetes`` target): its port from gateways only.

The scraper is every pod of the namespace named by ``observability.prometheusNamespace`` (selected by the
``kubernetes.io/metadata.name`` label the API server sets on every namespace). The policies restrict ingress
only: egress (DNS, the model bucket, the Hub, the Kubernetes API) is not restricted. Kubelet probes come from the
node, which NetworkPolicy implementations (including the VPC CNI's) always admit.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from fleet.spec.stack import FleetSpec
from infra.k8s_shapes import shaped
from infra.quota_cache import REDIS_PORT

__all__ = ["DEFAULT_DENY", "NAMESPACE_NAME_LABEL", "NetworkPolicies", "network_policy_specs"]

DEFAULT_DENY = "llmfleet-default-deny"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


def _pods(component: str) -> dict[str, Any]:
    return {"pod_selector": {"match_labels": {contract.LABEL_COMPONENT: component}}}


def _scraper(spec: FleetSpec) -> dict[str, Any]:
    return {"namespace_selector": {"match_labels": {NAMESPACE_NAME_LABEL: spec.observability.prometheus_namespace}}}


def _port(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def network_policy_specs(spec: FleetSpec, in_cluster_redis: bool) -> dict[str, dict[str, Any]]:
    """NetworkPolicy name -> its ``spec`` (snake_case keys, as pulumi_kubernetes inputs)."""
    gateways, control_plane, engines = (
        _pods(contract.COMPONENT_GATEWAY),
        _pods(contract.COMPONENT_CONTROL_PLANE),
        _pods(contract.COMPONENT_ENGINE),
    )
    specs: dict[str, dict[str, Any]] = {
        DEFAULT_DENY: {"pod_selector": {}, "policy_types": ["Ingress"]},
        "llmfleet-engine-ingress": {
            **engines,
            "policy_types": ["Ingress"],
            "ingress": [
                {"from": [gateways, _scraper(spec)], "ports": [_port(contract.ENGINE_PORT)]},
                {"from": [gateways, control_plane, _scraper(spec)], "ports": [_port(contract.AGENT_PORT)]},
            ],
        },
        "llmfleet-control-plane-ingress": {
            **control_plane,
            "policy_types": ["Ingress"],
            # The scraper reads /metrics (replicas, targets: the dashboards' replica panels and annotations); every
            # write on this port needs the control credential anyway.
            "ingress": [{"from": [engines, gateways, _scraper(spec)], "ports": [_port(spec.control_plane.port)]}],
        },
        "llmfleet-gateway-ingress": {
            **_pods(contract.COMPONENT_GATEWAY),
            "policy_types": ["Ingress"],
            "ingress": [
                {"ports": [_port(spec.gateway.port)]},  # no ``from``: any source, the public entry
                {"from": [_scraper(spec)], "ports": [_port(spec.gateway.admin_port)]},
            ],
        },
    }
    if any(pool.engine.kv_events for pool in spec.pools):  # the events' only readers are the gateways' indexes
        rule = {"from": [gateways], "ports": [_port(contract.KV_EVENTS_PORT)]}
        specs["llmfleet-engine-ingress"]["ingress"].append(rule)
    side_channels = sorted({p.disaggregation.side_channel_port for p in spec.pools if p.disaggregation is not None})
    if side_channels:  # decode engines handshake with prefill engines (fleet.spec.disagg)
        rule = {"from": [engines], "ports": [_port(port) for port in side_channels]}
        specs["llmfleet-engine-ingress"]["ingress"].append(rule)
    if in_cluster_redis:
        specs["llmfleet-quota-redis-ingress"] = {
            **_pods(contract.COMPONENT_QUOTA_REDIS),
            "policy_types": ["Ingress"],
            "ingress": [{"from": [gateways], "ports": [_port(REDIS_PORT)]}],
        }
    return specs


class NetworkPolicies(pulumi.ComponentResource):
    """The fleet namespace's NetworkPolicies (`network_policy_specs`)."""

    def __init__(
        self,
        name: str,
        spec: FleetSpec,
        in_cluster_redis: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmfleet:k8s:NetworkPolicies", name, None, opts)
        labels = {contract.LABEL_ENVIRONMENT: spec.environment, "app.kubernetes.io/part-of": "llmfleet"}
        for policy, body in network_policy_specs(spec, in_cluster_redis).items():
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{policy.removeprefix('llmfleet-')}",
                metadata={"name": policy, "namespace": spec.cluster.namespace, "labels": labels},
                spec=shaped(body, k8s.networking.v1.NetworkPolicySpecArgsDict),
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({})
