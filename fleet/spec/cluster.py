"""Cluster spec: where the fleet runs: the cluster, its node groups, images, observability, model store and cost.

Part of `fleet.spec.stack` (every model is importable from there); checked across fields by `fleet.spec.validate`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from fleet.spec.base import _DIGEST, _KEY_PREFIX, _REGISTRY, Name, Spec

__all__ = [
    "ClusterSpec",
    "CostSpec",
    "CpuNodeGroupSpec",
    "GpuNodeGroupSpec",
    "ImagesSpec",
    "ModelStoreSpec",
    "ObservabilitySpec",
]


class ClusterSpec(Spec):
    kubernetes_version: str = Field(default="1.35", pattern=r"^1\.\d{2}$")
    """EKS Kubernetes version of the control plane, the node groups and the managed add-ons. Keep it in EKS
    standard support (1.35 until 27 Mar 2027): the cluster's support policy is STANDARD, so EKS upgrades it at the
    end of standard support. Raise it one minor version per `pulumi up`."""
    namespace: Name = "llmfleet"
    """Namespace of every llmfleet workload."""
    kubeconfig: str | None = None
    """Target=kubernetes: path or context of an existing cluster."""
    public_endpoint_cidrs: list[str] = Field(default_factory=list)
    """CIDRs allowed to reach the EKS API endpoint from the internet; empty (the default): no public endpoint, the API
    is reachable only from inside the VPC (or a network peered with it)."""
    admin_role_arns: list[str] = Field(default_factory=list)
    """IAM roles (arn:aws:iam::<account>:role/<name>) given cluster admin through EKS access entries (people)."""
    ci_role_arns: list[str] = Field(default_factory=list)
    """IAM roles of the CI that runs `pulumi up`, given cluster admin the same way. The cluster grants its creator
    nothing implicitly, so the identity that runs the first `pulumi up` must be in one of the two lists."""
    log_retention_days: int = 90
    """Days the EKS control-plane log group keeps its logs (a CloudWatch retention: 1, 3, 5, 7, 14, 30, 60, 90,
    120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653)."""
    install_metrics_server: bool = True
    """Install metrics-server (the gateway HPA's CPU metrics); false on a cluster that already runs one."""


class GpuNodeGroupSpec(Spec):
    """A GPU managed node group, created once per availability zone it spans."""

    name: Name
    """Node group name, referenced by pools[].nodeGroup."""
    instance_type: str
    """GPU instance type from the catalogue (p4d/p4de.24xlarge, p5/p5e.48xlarge, g5.*, g6.*, g6e.*)."""
    zones: list[str] | None = None
    """Default: every zone of the stack."""
    min_nodes_per_az: int = Field(default=0, ge=0, le=100)
    """Nodes kept in each zone."""
    max_nodes_per_az: int = Field(default=2, ge=0, le=100)
    """Most nodes in each zone (the autoscaler's ceiling)."""
    capacity_type: Literal["on-demand", "spot", "capacity-block"] = "on-demand"
    """Purchase option of the nodes."""
    root_volume_gib: int = Field(default=100, ge=50, le=16384)
    """Root volume size. Every catalogue GPU type has instance-store NVMe: nodeadm's RAID holds the model cache and
    bind-mounts containerd's images, the kubelet's volumes and pod logs, so the root keeps only the OS."""
    node_cold_start_seconds: float = Field(default=600.0, ge=0.0, le=7200.0)
    """Seconds from raising a zone's desired size to a node that can start an engine (EC2 boot, nodeadm join,
    the engine image pull): how far ahead the control plane provisions nodes, on top of the pool's cold start.
    Replace the default with what your nodes measure (the aws actuator times each node it orders; ``llmfleet
    status`` shows the median); 0: nodes are not provisioned ahead."""
    paid_split: Literal["even", "demand"] = "even"
    """How the pools placed here share the GPUs of the minimum nodes (`replicas.fillPaidNodes`): ``even``, split
    once by GPUs held; ``demand``, split again every control tick by what each pool wants, a pool over its share
    yielding GPUs to one that wants more (docs/operations.md, the paid floor guard-rail). ``demand`` pays fewer
    GPU-hours, and can lower a bursty pool's share within the SLO: measure it with `llmfleet simulate-shared`."""


class CpuNodeGroupSpec(Spec):
    """The CPU node group for gateways and the control plane, spread over every zone."""

    instance_type: str = "m6i.xlarge"
    """Instance type of the CPU node group (gateways, control plane)."""
    min_nodes: int = Field(default=2, ge=1, le=100)
    """Nodes of the group: what it runs at, unless `autoscaler` is external."""
    max_nodes: int = Field(default=2, ge=1, le=100)
    """Most nodes (default: minNodes). Above minNodes only with `autoscaler: external`: the fleet's own autoscaler
    resizes GPU groups only, and the program installs no cluster-autoscaler or Karpenter."""
    autoscaler: Literal["none", "external"] = "none"
    """What resizes the group between minNodes and maxNodes: none, or external (a cluster-autoscaler or Karpenter
    the cluster owner runs: `pulumi up` keeps the group's live desired size while the bounds are unchanged)."""

    @model_validator(mode="before")
    @classmethod
    def _max_defaults_to_min(cls, data: object) -> object:
        # maxNodes left out means a fixed group of minNodes, not the field's own default.
        if isinstance(data, dict) and not {"maxNodes", "max_nodes"} & data.keys():
            minimum = data.get("minNodes", data.get("min_nodes"))
            if minimum is not None:
                return {**data, "maxNodes": minimum}
        return data


class ImagesSpec(Spec):
    """Container images, pinned by digest. ``runtime`` runs the gateway, the control plane and simulated engines;
    ``engine`` runs ``llmfleet agent`` supervising vLLM. On aws they come from the stack's own ECR repositories;
    on kubernetes from ``<registry>/runtime`` and ``<registry>/engine``. `make images` prints the digests."""

    registry: str | None = Field(default=None, pattern=_REGISTRY)
    """Target kubernetes: where the images are pushed (e.g. ghcr.io/acme/llmfleet); unused on aws (ECR)."""
    runtime_digest: str | None = Field(default=None, pattern=_DIGEST)
    """Digest of the runtime image (sha256:...); required on aws and kubernetes."""
    engine_digest: str | None = Field(default=None, pattern=_DIGEST)
    """Digest of the engine image (sha256:...); required when a pool runs vLLM on a node group."""
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"


# Kubernetes label syntax: a name (or value) of at most 63 characters; an optional DNS-subdomain prefix.
_LABEL_NAME = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ObservabilitySpec(Spec):
    install_operator_crds: bool = True
    """Install the Prometheus Operator CRDs the SLO rules need; false when the cluster already runs the operator."""
    prometheus_namespace: Name = "monitoring"
    """Namespace of the Prometheus that scrapes the fleet: the network policies admit its pods to the engines'
    metrics ports (selected by the namespace's `kubernetes.io/metadata.name` label)."""
    grafana_dashboards: bool = True
    """Install the fleet's Grafana dashboards as ConfigMaps in `prometheusNamespace`, labelled for the Grafana
    dashboard sidecar (kube-prometheus-stack); false when that namespace does not exist or runs no Grafana."""
    prometheus_selector_labels: dict[str, str] = Field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    """Labels on the fleet's PrometheusRules and PodMonitors: what the Prometheus that evaluates and scrapes them
    selects them by. kube-prometheus-stack's Prometheus selects only `release: <its Helm release name>` unless told
    otherwise; the default matches a release named `kube-prometheus-stack`. `{}` for a Prometheus that selects
    every rule and monitor."""

    @field_validator("prometheus_selector_labels")
    @classmethod
    def _selector_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            prefix, _, name = key.rpartition("/")
            if not _LABEL_NAME.match(name) or (prefix and not _LABEL_PREFIX.match(prefix)):
                raise ValueError(f"{key!r} is not a Kubernetes label key ([prefix/]name, at most 63 characters)")
            if prefix.endswith("llmfleet.io"):
                raise ValueError(f"{key!r}: the fleet sets its own llmfleet.io labels")
            if value and not _LABEL_NAME.match(value):
                raise ValueError(f"{value!r} (label {key!r}) is not a Kubernetes label value (at most 63 characters)")
        return labels


class ModelStoreSpec(Spec):
    """Where engines get their weights: the stack's model bucket (stack output ``modelBucket``, given to engine
    pods as ``LLMFLEET_MODEL_BUCKET``), filled by ``llmfleet model push``. A stack without a bucket (local)
    loads models as the engine always did."""

    prefix: str = Field(default="models", pattern=_KEY_PREFIX)
    """Key prefix in the bucket: a model lives under `<prefix>/<model id>/<revision>/`."""
    hub_fallback: bool = False
    """Load a pool's model from the Hugging Face Hub when the store cannot provide it (not pushed, unreachable,
    failed checksums); false: the agent fails with the reason instead."""
    concurrency: int = Field(default=16, ge=1, le=64)
    """Ranged GETs the agent keeps in flight for one file larger than `partSizeMib` (1: one part after the other).
    AWS suggests one request per 85-90 MB/s wanted, about 15 for a 10 Gb/s NIC."""
    part_size_mib: int = Field(default=16, ge=1, le=1024)
    """Size of each ranged GET; smaller files take one GET. AWS suggests 8-16 MB; 16 divides `llmfleet model
    push`'s 64 MiB upload parts."""


class CostSpec(Spec):
    gpu_hour_usd: float | None = Field(default=None, ge=0.0, le=1000.0)
    """A negotiated price per GPU-hour for every GPU node group. Default: the catalogue's on-demand price of the
    group's instance type in the stack's region (fleet/capacity/catalog.py), divided by its GPUs."""
    monthly_ceiling_usd: float | None = Field(default=None, ge=0.0)
    """Warn (and fail the policy pack) above this monthly cost."""
