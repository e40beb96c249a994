"""Gateway: the OpenAI-compatible entry point, the only Service exposed outside the cluster.

A Deployment of ``llmfleet gateway --stack <file> --port <port>`` spread over zones, a LoadBalancer Service
(on AWS an NLB made by the AWS Load Balancer Controller: pod-IP targets, cross-zone, internet-facing, or
internal when ``gateway.public`` is false), an HPA on CPU (gateways are stateless) and a PodDisruptionBudget
keeping all but one replica up during node drains.

Idle timeout: a plain TCP listener's is set a minute above the request timeout; a TLS listener's is fixed at
350 s (the controller skips listener attributes on TLS), so validation keeps the request timeout below it
(`fleet.spec.validate_timing`). Shutdown: the gateway drains itself on SIGTERM (`gateway.drain`,
``--drain-propagation``: ``drain.propagationSeconds``, at least 120 s on aws): readiness down and ``Connection:
close`` at once, listening until the NLB's deregistration is over (its delay attribute is set to the propagation),
then in-flight requests finish; no preStop hook, so the gateway knows from the first second that it is leaving;
the fleet namespace is labelled for the controller's readiness gates, so a rollout waits for new pods to be
healthy targets.

Rollouts on change: the pod template carries sha256 checksums of what a gateway reads at start (the rendered
stack file, the tenant key hashes, the engines' API key), so `pulumi up` rolls the gateways when any changes.
With Redis quotas provisioned by the program, the Deployment reads the Redis URL from its Secret; it always reads
the engines' API key (sent upstream) from theirs, both as files (`infra.k8s_base.llmfleet_command`). It makes no
Kubernetes API call (its control token's audience is ``llmfleet``), so it mounts no API token. With a model
bucket (aws) its pods get ``$LLMFLEET_MODEL_BUCKET``, an emptyDir for the tokenizers they fetch from it
(`gateway.tokenizer_store`; the root file system is read-only) and the IRSA role that reads only those
(`infra.iam.tokenizer_read_policy`) on their ServiceAccount.

TLS (`tls_termination`): on aws the NLB's listener on 443 terminates it with the stack's ACM certificate (TLS 1.2
and 1.3 only); on kubernetes the gateway process does, from the stack's TLS Secret, probed over HTTPS. Either way
only ``gateway.tls.sourceCidrs`` may reach the load balancer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from fleet.protocol.marks import (
    ANN_CHECKSUM_ENGINE_KEY,
    ANN_CHECKSUM_STACK,
    ANN_CHECKSUM_TENANT_KEYS,
    LB_DEREGISTRATION_DELAY,
)
from fleet.spec.stack import FleetSpec
from infra.control_auth import token_env, token_mount, token_volume
from infra.images import ImageRefs
from infra.k8s_base import (
    ENGINE_API_KEY_FILE,
    container_security_context,
    http_probe,
    irsa_annotations,
    llmfleet_command,
    model_bucket_env,
    pod_security_context,
    render_stack_file,
    secret_checksum,
    sha256_text,
    spec_volumes,
)
from infra.k8s_shapes import shaped
from infra.quota_redis import provisions_redis, redis_url_files

__all__ = [
    "TLS_POLICY",
    "Gateway",
    "GatewayArgs",
    "gateway_listener",
    "gateway_pod_annotations",
    "gateway_pod_spec",
    "gateway_service_spec",
    "gateway_service_annotations",
    "load_balanced",
    "nlb_idle_timeout_s",
    "propagation_seconds",
    "tls_termination",
]

_LB = "service.beta.kubernetes.io/aws-load-balancer"
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"  # TLS 1.3 and 1.2 only, on the NLB's listener


def tls_termination(spec: FleetSpec) -> str:
    """Where the public listener's TLS ends (`fleet.protocol.contract.ANN_TLS`): the NLB with an ACM certificate on
    aws, the
    gateway process with a TLS Secret on kubernetes, else nowhere."""
    tls = spec.gateway.tls
    if spec.target == "aws" and tls.certificate_arn is not None:
        return "load-balancer"
    if spec.target == "kubernetes" and tls.secret_name is not None:
        return "gateway"
    return "none"


def gateway_listener(spec: FleetSpec) -> tuple[str, int]:
    """The Service's one listener (protocol, port): TLS on 443 when TLS ends anywhere, else plain TCP on 80."""
    return {"load-balancer": ("TLS", 443), "gateway": ("TCP", 443)}.get(tls_termination(spec), ("TCP", 80))


def nlb_idle_timeout_s(spec: FleetSpec) -> int:
    """A TCP listener's idle timeout: a minute above the gateway's request timeout (the NLB allows 60 to 6000 s)."""
    wanted = math.ceil(spec.gateway.timeouts.total_s) + 60
    return max(60, min(contract.NLB_MAX_IDLE_TIMEOUT_S, wanted))


def gateway_service_annotations(spec: FleetSpec) -> dict[str, str]:
    """The gateway's request timeout, and on aws the AWS Load Balancer Controller's NLB annotations.

    ``type: external`` hands the Service to the controller (the in-tree provider ignores it); pod-IP targets
    skip the NodePort hop; the scheme follows ``gateway.public``. A TCP listener's idle timeout is set above the
    request timeout; a TLS listener takes no attribute (its 350 s is fixed and the controller would skip it).
    The target group's deregistration delay is the gateway's drain propagation: the NLB has stopped routing to a
    pod by the time it stops listening.
    """
    annotations = {
        contract.ANN_REQUEST_TIMEOUT: str(math.ceil(spec.gateway.timeouts.total_s)),
        contract.ANN_TLS: tls_termination(spec),
    }
    if spec.target != "aws":
        return annotations
    annotations |= {
        f"{_LB}-type": "external",
        f"{_LB}-nlb-target-type": "ip",
        f"{_LB}-scheme": "internet-facing" if spec.gateway.public else "internal",
        f"{_LB}-attributes": "load_balancing.cross_zone.enabled=true",
    }
    protocol, port = gateway_listener(spec)
    if protocol == "TCP":
        annotations[f"{_LB}-listener-attributes.{protocol}-{port}"] = (
            f"tcp.idle_timeout.seconds={nlb_idle_timeout_s(spec)}"
        )
    annotations[f"{_LB}-target-group-attributes"] = f"{LB_DEREGISTRATION_DELAY}={propagation_seconds(spec)}"
    if spec.gateway.tls.certificate_arn is not None:
        annotations |= {
            f"{_LB}-ssl-cert": spec.gateway.tls.certificate_arn,
            f"{_LB}-ssl-ports": str(port),
            f"{_LB}-ssl-negotiation-policy": TLS_POLICY,
        }
    return annotations


def propagation_seconds(spec: FleetSpec) -> int:
    """How long a stopping gateway keeps listening (``--drain-propagation``): ``drain.propagationSeconds``, whole
    seconds."""
    return math.ceil(spec.gateway.drain.propagation_seconds)


def gateway_pod_annotations(
    spec: FleetSpec, tenant_key_hashes: pulumi.Input[str], engine_api_key: pulumi.Input[str]
) -> dict[str, pulumi.Input[str]]:
    """Checksums of what a gateway reads at start: a change to any of them changes the pod template, so
    `pulumi up` rolls the gateways. (A running gateway also re-reads the key table when its Secret changes,
    `gateway.auth.KeyHashesFile`; the rollout covers the stack file and the engine key, read once.)"""
    return {
        ANN_CHECKSUM_STACK: sha256_text(render_stack_file(spec)),
        ANN_CHECKSUM_TENANT_KEYS: secret_checksum(tenant_key_hashes),
        ANN_CHECKSUM_ENGINE_KEY: secret_checksum(engine_api_key),
    }


def _quota_annotations(spec: FleetSpec) -> dict[str, str]:
    gateway = spec.gateway
    annotations: dict[str, str] = {contract.ANN_QUOTA_BACKEND: gateway.quota_backend}
    if gateway.quota_backend == "redis":
        annotations[contract.ANN_REDIS_URL_FROM] = "secret" if provisions_redis(spec) else "stack"
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
    images: ImageRefs
    tenant_key_hashes: pulumi.Input[str]  # JSON {tenant: [sha256:...]}: checksummed on the pod template
    engine_api_key: pulumi.Input[str]  # secret: checksummed on the pod template
    deployment_after: Sequence[pulumi.Resource] = field(default_factory=list)  # e.g. the quota Redis and its Secret
    service_after: Sequence[pulumi.Resource] = field(default_factory=list)  # e.g. the load balancer controller
    model_bucket: pulumi.Input[str] | None = None  # where pools' tokenizers come from (aws)
    role_arn: pulumi.Input[str] | None = None  # IRSA role reading them (aws)


def _gateway_volumes(spec: FleetSpec, store: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(volumes, mounts, TLS arguments): the stack file and key hashes, the engine key and Redis URL files, ``/tmp``,
    the tokenizer cache with a model bucket (``store``), the TLS Secret where the gateway terminates TLS, the
    projected control token."""
    volumes, mounts = spec_volumes(spec)
    files = [ENGINE_API_KEY_FILE, *redis_url_files(spec)]
    # A read-only root file system; /tmp (Python's tempfile) and the tokenizer cache are the writable places.
    volumes = [*volumes, *(f.volume_spec() for f in files), {"name": "tmp", "empty_dir": {"size_limit": "256Mi"}}]
    mounts = [*mounts, *(f.mount() for f in files), {"name": "tmp", "mount_path": "/tmp"}]
    if store:
        volumes = [*volumes, {"name": "tokenizers", "empty_dir": {"size_limit": "1Gi"}}]
        mounts = [*mounts, {"name": "tokenizers", "mount_path": contract.TOKENIZER_CACHE_DIR}]
    tls_args: list[str] = []
    if tls_termination(spec) == "gateway":
        volumes = [*volumes, {"name": "tls", "secret": {"secret_name": spec.gateway.tls.secret_name}}]
        mounts = [*mounts, {"name": "tls", "mount_path": contract.TLS_DIR, "read_only": True}]
        tls_args = ["--tls-cert", f"{contract.TLS_DIR}/tls.crt", "--tls-key", f"{contract.TLS_DIR}/tls.key"]
    return [*volumes, token_volume()], [*mounts, token_mount()], tls_args


def _gateway_container(
    spec: FleetSpec, images: ImageRefs, model_bucket: pulumi.Input[str] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the gateway's container, the pod's volumes)."""
    gw = spec.gateway
    volumes, mounts, tls_args = _gateway_volumes(spec, model_bucket is not None)
    store = [{"name": contract.TOKENIZER_CACHE_ENV, "value": contract.TOKENIZER_CACHE_DIR}] if model_bucket else []
    scheme = "HTTPS" if tls_args else "HTTP"
    container = {
        "name": "gateway",
        "image": images.runtime,
        "image_pull_policy": spec.images.pull_policy,
        "command": llmfleet_command([ENGINE_API_KEY_FILE, *redis_url_files(spec)]),
        "args": [
            "gateway",
            "--stack",
            contract.stack_file_path(spec.environment),
            "--port",
            str(gw.port),
            "--admin-port",
            str(gw.admin_port),
            "--shutdown-timeout",
            str(gw.drain.shutdown_timeout),
            "--drain-propagation",
            str(propagation_seconds(spec)),
            *tls_args,
        ],
        # The admin port (/readyz, /metrics) is no Service's: kubelet and Prometheus reach the pod.
        "ports": [
            {"name": "http", "container_port": gw.port},
            {"name": "admin", "container_port": gw.admin_port},
        ],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "startup_probe": http_probe("/healthz", gw.port, 2, 30, scheme),
        "readiness_probe": http_probe("/readyz", gw.admin_port, 5, 2),
        "liveness_probe": http_probe("/healthz", gw.port, 10, 3, scheme),
        "volume_mounts": mounts,
        "security_context": container_security_context(read_only_root=True),
        "env": [*token_env(), *model_bucket_env(model_bucket), *store],
    }
    return container, volumes


def gateway_pod_spec(
    spec: FleetSpec, images: ImageRefs, model_bucket: pulumi.Input[str] | None = None
) -> dict[str, Any]:
    """The gateway's pod spec (snake_case keys, as pulumi_kubernetes inputs): its own account, spread over zones,
    on the CPU nodes on aws; told the model bucket when the stack has one."""
    container, volumes = _gateway_container(spec, images, model_bucket)
    pod: dict[str, Any] = {
        "service_account_name": contract.GATEWAY_NAME,
        "automount_service_account_token": False,  # no API calls (its account mounts none either)
        "termination_grace_period_seconds": spec.gateway.drain.grace_seconds,  # = propagation + shutdown + margin
        "security_context": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
        "topology_spread_constraints": [
            {
                "max_skew": 1,
                "topology_key": contract.ZONE_TOPOLOGY_KEY,
                "when_unsatisfiable": "ScheduleAnyway",
                "label_selector": {"match_labels": _labels(spec)},
            }
        ],
    }
    if spec.target == "aws":
        pod["node_selector"] = {contract.LABEL_NODE_ROLE: "cpu"}
    return pod


def load_balanced(spec: FleetSpec) -> bool:
    """Whether the gateway's Service is a LoadBalancer: a public gateway, and on aws even a private one (an
    internal NLB: clients in the VPC reach it)."""
    return spec.gateway.public or spec.target == "aws"


def gateway_service_spec(spec: FleetSpec) -> dict[str, Any]:
    """The gateway Service's ``spec``: its one listener, open to ``gateway.tls.sourceCidrs`` when load balanced."""
    _, listener_port = gateway_listener(spec)
    service: dict[str, Any] = {
        "type": "LoadBalancer" if load_balanced(spec) else "ClusterIP",
        "selector": _labels(spec),
        "ports": [{"name": "http", "port": listener_port, "target_port": "http"}],
    }
    if load_balanced(spec):
        service["load_balancer_source_ranges"] = list(spec.gateway.tls.source_cidrs)
    return service


def _hpa_spec(spec: FleetSpec) -> dict[str, Any]:
    """On CPU (gateways are stateless): from ``gateway.replicas`` to three times as many (at least 2 more)."""
    replicas = spec.gateway.replicas
    cpu = {"type": "Utilization", "average_utilization": 70}
    return {
        "scale_target_ref": {"api_version": "apps/v1", "kind": "Deployment", "name": contract.GATEWAY_NAME},
        "min_replicas": replicas,
        "max_replicas": max(replicas * 3, replicas + 2),
        "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": cpu}}],
    }


class Gateway(pulumi.ComponentResource):
    """Gateway Deployment, LoadBalancer Service, HPA and PDB; ``url`` is where clients send requests
    (``https://<gateway.hostname>`` when set), ``load_balancer`` the load balancer's DNS name ("" without one)."""

    url: pulumi.Output[str]
    load_balancer: pulumi.Output[str]

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:Gateway", name, None, opts)
        spec = args.spec
        labels = _labels(spec)
        meta: k8s.meta.v1.ObjectMetaArgsDict = {
            "namespace": spec.cluster.namespace,
            "labels": labels,
            "name": contract.GATEWAY_NAME,
        }
        child = pulumi.ResourceOptions(parent=self)
        # Its own account: the control plane tells gateways from agents by the account that signed their token.
        account = k8s.core.v1.ServiceAccount(
            f"{name}-account",
            metadata={**meta, "annotations": irsa_annotations(args.role_arn)},  # on aws: reads pools' tokenizers
            automount_service_account_token=False,
            opts=child,
        )
        template_annotations = gateway_pod_annotations(spec, args.tenant_key_hashes, args.engine_api_key)
        deployment = {
            "replicas": spec.gateway.replicas,
            "selector": {"match_labels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": template_annotations},
                "spec": gateway_pod_spec(spec, args.images, args.model_bucket),
            },
        }
        k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata={**meta, "annotations": _quota_annotations(spec)},
            spec=shaped(deployment, k8s.apps.v1.DeploymentSpecArgsDict),
            opts=pulumi.ResourceOptions(
                parent=self, ignore_changes=["spec.replicas"], depends_on=[*args.deployment_after, account]
            ),
        )
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata={**meta, "annotations": gateway_service_annotations(spec)},
            spec=shaped(gateway_service_spec(spec), k8s.core.v1.ServiceSpecArgsDict),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.service_after)),
        )
        k8s.autoscaling.v2.HorizontalPodAutoscaler(
            f"{name}-hpa",
            metadata=meta,
            spec=shaped(_hpa_spec(spec), k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgsDict),
            opts=child,
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=meta,
            spec=shaped(
                {"max_unavailable": 1, "selector": {"match_labels": labels}},
                k8s.policy.v1.PodDisruptionBudgetSpecArgsDict,
            ),
            opts=child,
        )
        self._addresses(spec, service)
        self.register_outputs({"url": self.url, "loadBalancer": self.load_balancer})

    def _addresses(self, spec: FleetSpec, service: k8s.core.v1.Service) -> None:
        """``load_balancer`` from the Service's status (when load balanced); ``url`` from the hostname, else the
        load balancer, else the in-cluster Service."""
        web = "https" if tls_termination(spec) != "none" else "http"
        if load_balanced(spec):
            self.load_balancer = service.status.apply(_lb_host)
        else:
            self.load_balancer = pulumi.Output.from_input("")
        if spec.gateway.hostname is not None:
            self.url = pulumi.Output.from_input(f"{web}://{spec.gateway.hostname}")
        elif load_balanced(spec):
            self.url = self.load_balancer.apply(lambda host: f"{web}://{host}" if host else "")
        else:
            self.url = pulumi.Output.from_input(
                f"{web}://{contract.GATEWAY_NAME}.{spec.cluster.namespace}.svc.cluster.local"
            )


def _lb_host(status: Any) -> str:
    ingress = getattr(getattr(status, "load_balancer", None), "ingress", None) or []
    if not ingress:
        return ""
    return str(ingress[0].hostname or ingress[0].ip or "")
