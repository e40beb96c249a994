"""Gateway: the OpenAI-compatible entry point, the only Service exposed outside the cluster.

A Deployment of ``llmfleet gateway --stack <file> --port <port>`` spread over zones, a LoadBalancer Service
(an internet-facing NLB with cross-zone balancing on AWS; internal when ``gateway.public`` is false), an HPA
on CPU (gateways are stateless) and a PodDisruptionBudget keeping all but one replica up during node drains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet import contract
from fleet.spec import FleetSpec
from infra.k8s_base import http_probe, spec_volumes

__all__ = ["Gateway", "GatewayArgs", "gateway_service_annotations"]

_NLB = "service.beta.kubernetes.io/aws-load-balancer"


def gateway_service_annotations(spec: FleetSpec) -> dict[str, str]:
    """NLB annotations (AWS cloud provider): network LB, cross-zone, internal unless the gateway is public."""
    if spec.target != "aws":
        return {}
    annotations = {
        f"{_NLB}-type": "nlb",
        f"{_NLB}-cross-zone-load-balancing-enabled": "true",
        f"{_NLB}-connection-idle-timeout": str(int(spec.gateway.timeouts.total_s)),
    }
    if not spec.gateway.public:
        annotations[f"{_NLB}-internal"] = "true"
    return annotations


def _labels(spec: FleetSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "llmfleet",
        contract.LABEL_COMPONENT: contract.COMPONENT_GATEWAY,
        contract.LABEL_ENVIRONMENT: spec.environment,
    }


@dataclass(frozen=True)
class GatewayArgs:
    spec: FleetSpec


class Gateway(pulumi.ComponentResource):
    """Gateway Deployment, LoadBalancer Service, HPA and PDB; ``url`` is where clients send requests."""

    url: pulumi.Output[str]

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:Gateway", name, None, opts)
        spec = args.spec
        gw = spec.gateway
        labels = _labels(spec)
        meta: dict[str, Any] = {"namespace": spec.cluster.namespace, "labels": labels, "name": contract.GATEWAY_NAME}
        volumes, mounts = spec_volumes(spec)
        pod: dict[str, Any] = {
            "termination_grace_period_seconds": int(gw.timeouts.total_s) + 10,  # in-flight streams finish
            "containers": [
                {
                    "name": "gateway",
                    "image": spec.images.control,
                    "image_pull_policy": spec.images.pull_policy,
                    "command": ["llmfleet"],
                    "args": ["gateway", "--stack", contract.stack_file_path(spec.environment), "--port", str(gw.port)],
                    "ports": [{"name": "http", "container_port": gw.port}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                    "startup_probe": http_probe("/healthz", gw.port, 2, 30),
                    "readiness_probe": http_probe("/readyz", gw.port, 5, 2),
                    "liveness_probe": http_probe("/healthz", gw.port, 10, 3),
                    "lifecycle": {"pre_stop": {"sleep": {"seconds": 10}}},  # let the LB deregister the pod
                    "volume_mounts": mounts,
                    "security_context": {"allow_privilege_escalation": False, "run_as_non_root": True},
                }
            ],
            "volumes": volumes,
            "topology_spread_constraints": [
                {
                    "max_skew": 1,
                    "topology_key": contract.ZONE_TOPOLOGY_KEY,
                    "when_unsatisfiable": "ScheduleAnyway",
                    "label_selector": {"match_labels": labels},
                }
            ],
        }
        if spec.target == "aws":
            pod["node_selector"] = {contract.LABEL_NODE_ROLE: "cpu"}
        k8s.apps.v1.Deployment(  # type: ignore[call-overload]
            f"{name}-deployment",
            metadata=meta,
            spec={
                "replicas": gw.replicas,
                "selector": {"match_labels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod},
            },
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["spec.replicas"]),
        )
        service = k8s.core.v1.Service(  # type: ignore[call-overload]
            f"{name}-service",
            metadata={**meta, "annotations": gateway_service_annotations(spec)},
            spec={
                "type": "LoadBalancer" if gw.public else "ClusterIP",
                "selector": labels,
                "ports": [{"name": "http", "port": 80, "target_port": "http"}],
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        k8s.autoscaling.v2.HorizontalPodAutoscaler(  # type: ignore[call-overload]
            f"{name}-hpa",
            metadata=meta,
            spec={
                "scale_target_ref": {"api_version": "apps/v1", "kind": "Deployment", "name": contract.GATEWAY_NAME},
                "min_replicas": gw.replicas,
                "max_replicas": max(gw.replicas * 3, gw.replicas + 2),
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {"name": "cpu", "target": {"type": "Utilization", "average_utilization": 70}},
                    }
                ],
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        k8s.policy.v1.PodDisruptionBudget(  # type: ignore[call-overload]
            f"{name}-pdb",
            metadata=meta,
            spec={"max_unavailable": 1, "selector": {"match_labels": labels}},
            opts=pulumi.ResourceOptions(parent=self),
        )
        if gw.public:
            self.url = service.status.apply(_lb_url)
        else:
            self.url = pulumi.Output.from_input(
                f"http://{contract.GATEWAY_NAME}.{spec.cluster.namespace}.svc.cluster.local"
            )
        self.register_outputs({"url": self.url})


def _lb_url(status: Any) -> str:
    ingress = getattr(getattr(status, "load_balancer", None), "ingress", None) or []
    if not ingress:
        return ""
    host = ingress[0].hostname or ingress[0].ip or ""
    return f"http://{host}" if host else ""
