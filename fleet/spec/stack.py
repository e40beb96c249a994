"""FleetSpec: the typed model of a stack file's ``llmfleet:*`` keys.

Every runtime part (gateway, agent, autoscaler, simulator) and the Pulumi program read this one model.
Keys are camelCase in YAML (``gpuMemoryUtilization``) and snake_case in Python. Models are frozen and reject
unknown keys; cross-field checks that need the catalogue or the plugin registries live in `fleet.spec.validate`.
The pool's keys are in `fleet.spec.pool`, the gateway's in `fleet.spec.gateway`, the shared base in
`fleet.spec.base`; every model is importable from here.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from fleet.spec.base import _DIGEST, _KEY_PREFIX, _REGISTRY, KEY_HASH, Name, PluginRef, Spec
from fleet.spec.gateway import (
    GatewaySpec,
    GatewayTlsSpec,
    GatewayTracingSpec,
    QueueSpec,
    QuotaRedisSpec,
    RetrySpec,
    RoutingSpec,
    TimeoutSpec,
)
from fleet.spec.pool import (
    DRAIN_MARGIN_S,
    AdapterSpec,
    DrainSpec,
    EngineSpec,
    ModelFactsSpec,
    PoolSpec,
    ReplicasSpec,
    RestartWindowSpec,
    SimSpec,
    SloSpec,
    WorkloadSpec,
)

__all__ = [
    "DRAIN_MARGIN_S",
    "KEY_HASH",
    "AdapterSpec",
    "AliasSpec",
    "AutoscalingSpec",
    "ClusterSpec",
    "ControlPlaneSpec",
    "CostSpec",
    "CpuNodeGroupSpec",
    "DrainSpec",
    "EngineSpec",
    "FleetSpec",
    "GatewaySpec",
    "GatewayTlsSpec",
    "GatewayTracingSpec",
    "GpuNodeGroupSpec",
    "ImagesSpec",
    "ModelFactsSpec",
    "ModelStoreSpec",
    "ObservabilitySpec",
    "PluginRef",
    "PoolSpec",
    "QueueSpec",
    "QuotaRedisSpec",
    "ReplicasSpec",
    "RestartWindowSpec",
    "RetrySpec",
    "RolloutSpec",
    "RoutingSpec",
    "SimSpec",
    "SloSpec",
    "TenantSpec",
    "TimeoutSpec",
    "WorkloadSpec",
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
    Replace the default with what your nodes measure; 0: nodes are not provisioned ahead."""


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


class TenantSpec(Spec):
    name: Name
    """Tenant name."""
    api_key_hashes: list[str] = Field(default_factory=list)
    """"sha256:<hex>' of each key."""
    api_keys_secret: str | None = None
    """Pulumi secret config key holding a list of keys."""
    priority: int = Field(default=1, ge=0, le=9)
    """Higher is served first."""
    requests_per_second: float = Field(default=10.0, gt=0, le=1_000_000)
    """Request rate quota."""
    tokens_per_minute: int = Field(default=200_000, gt=0)
    """Token quota (prompt + max_tokens reserved at admission, reconciled after)."""
    max_concurrency: int = Field(default=32, ge=1, le=1_000_000)
    """Requests in flight at once."""
    allowed_models: list[str] = Field(default_factory=lambda: ["*"])
    """Served model names the tenant may use, or `*`."""

    @field_validator("api_key_hashes")
    @classmethod
    def _hash_shape(cls, value: list[str]) -> list[str]:
        for item in value:
            if not KEY_HASH.match(item):
                shown = item[:12] + "..." if len(item) > 12 else item
                raise ValueError(
                    f"{shown!r} is not a key hash; use 'sha256:<64 hex digits>' "
                    "(`llmfleet hash-key` prints one); plain keys never go in a stack file"
                )
        return value


class AutoscalingSpec(Spec):
    policy: PluginRef = Field(default_factory=lambda: PluginRef(name="target-tracking"))
    """Scaling policy by name (target-tracking, threshold) with parameters."""
    actuator: str = "local"
    """What carries decisions out: local, kubernetes, aws."""
    dry_run: bool = False
    """Log decisions without acting."""
    interval_s: float = Field(default=5.0, gt=0, le=600)
    """Control loop period."""
    target_queue_per_replica: float = Field(default=4.0, gt=0, le=10_000)
    """Waiting requests per replica the policy aims for."""
    target_kv_usage: float = Field(default=0.75, gt=0, le=1.0)
    """KV cache usage the policy aims for."""
    target_utilisation: float = Field(default=0.75, gt=0, le=1.0)
    """Busy fraction the policy aims for (the seed's 70-85% band)."""
    scale_up_stabilization_s: float = Field(default=0.0, ge=0, le=3600)
    """How long a higher desired count must persist before scaling up."""
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86_400)
    """How long a lower desired count must persist before scaling down."""
    max_scale_up_step: int = Field(default=4, ge=1, le=1000)
    """Most replicas added per decision."""
    max_scale_down_step: int = Field(default=1, ge=1, le=1000)
    """Most replicas removed per decision."""
    predictive: bool = False
    """Add the demand trend over the cold-start horizon."""
    predictive_fit_s: float | None = Field(default=None, gt=0, le=3600)
    """Window the predictive trend is fitted over (default: the cold start); the term acts only once the demand
    samples cover it, so a trend of a few ticks is never projected."""
    predictive_max_step: int = Field(default=2, ge=0, le=1000)
    """Most replicas the predictive term adds above the policy's own number."""
    ttft_queue_per_replica: float = Field(default=1.0, ge=0, le=10_000)
    """Requests waiting (engines + gateways) per ready replica from which a P99 TTFT over the SLO counts as
    queueing; below it the misses are prefill more replicas cannot shorten, and the TTFT rule neither adds a
    replica nor blocks a scale-down. 0: any P99 over the SLO acts."""
    ttft_queue_window_s: float | None = Field(default=None, ge=0, le=3600)
    """The queue that evidence is the median of the ticks of this window (default the cold start): a burst's
    own backlog, gone before a replica launched now could serve, is not queueing it can fix. 0: this tick's."""


class ControlPlaneSpec(Spec):
    port: int = Field(default=8090, ge=1, le=65535)
    """Control plane listen port."""
    url: str | None = None
    """Where agents and gateways reach it; default derived per target."""
    report_interval_s: float = Field(default=1.0, gt=0, le=60)
    """How often agents report."""
    stale_after_s: float = Field(default=5.0, gt=0, le=600)
    """A replica whose last report is older is stale (never read as idle)."""
    lease_ttl_s: float = Field(default=600.0, gt=0, le=86_400)
    """A restart lease expires after this if its holder does not release it."""

    @property
    def client_url(self) -> str:
        """Where an operator's command reaches it: ``url``, else this machine's port (the local fleet)."""
        return self.url or f"http://127.0.0.1:{self.port}"


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


# A name clients send as `model`: what OpenAI model ids and served model names look like.
_ALIAS_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
AliasName = Annotated[str, Field(pattern=_ALIAS_NAME)]
Weight = Annotated[int, Field(ge=0, strict=True)]


class RolloutSpec(Spec):
    """How a canary rollout of the alias runs (``llmfleet rollout start``), e.g. ``{steps: [1, 5, 25, 50, 100],
    bakeS: 300, minSamples: 100}``."""

    steps: list[int] = Field(default_factory=lambda: [1, 5, 25, 50, 100], min_length=2, max_length=20)
    """The candidate's percent of the alias, step by step: increasing, ending at 100 (reaching it promotes)."""
    bake_s: float = Field(default=300.0, gt=0, le=86_400)
    """Seconds each step is observed before the next; its window is judged against the baseline's."""
    min_samples: int = Field(default=100, ge=1, le=10_000_000)
    """Requests each side must have answered in a step's window before it is judged (no step up without them)."""
    tolerance: float = Field(default=0.10, ge=0.0, lt=1.0)
    """How much worse than the baseline the candidate's TTFT p99, TPOT p99 and error rate may be (0.10: 10%)."""
    baseline: str | None = None
    """The pool rolled away from (default: the alias's pool of highest weight other than the candidate)."""
    baseline_after: Literal["zero", "min"] = "zero"
    """After a promotion the baseline (at weight 0) drains down to no replica (zero) or to its replicas.min."""

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[int]) -> list[int]:
        if any(not 1 <= s <= 100 for s in steps) or steps[-1] != 100:
            raise ValueError(f"percents from 1 to 100, ending at 100; got {steps}")
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError(f"each step above the one before; got {steps}")
        return steps


class AliasSpec(Spec):
    """A model name served by several pools by weight, e.g. ``chat: {pools: {qwen-v1: 95, qwen-v2: 5}}``."""

    pools: dict[str, Weight] = Field(min_length=1)
    """Pool name -> weight (a non-negative integer): each pool's share of the alias's sessions is weight / sum."""
    fallback: str | None = None
    """A pool outside `pools` that takes the requests whose chosen pool has no ready replica."""
    sticky: Literal["session", "none"] = "session"
    """session: a conversation (session header, else its leading prompt blocks) keeps its pool; none: per request."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Canary rollouts of this alias: steps, bake time, samples, tolerance."""

    @model_validator(mode="after")
    def _rollout_baseline_is_a_pool(self) -> AliasSpec:
        baseline = self.rollout.baseline
        if baseline is not None and baseline not in self.pools:
            raise ValueError(f"rollout.baseline {baseline!r} is not one of the alias's pools ({', '.join(self.pools)})")
        return self


class FleetSpec(Spec):
    """The whole fleet as declared in ``stacks/Pulumi.<env>.yaml`` (keys ``llmfleet:<key>``)."""

    environment: Name
    """Environment name."""
    target: Literal["local", "kubernetes", "aws"]
    """Where the fleet runs: this machine, an existing Kubernetes cluster, or AWS (EKS)."""
    region: str = "us-east-1"
    """AWS region (also read from `aws:region`)."""
    availability_zones: list[str] = Field(min_length=1, max_length=6)
    """Zones the fleet spreads over."""
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    cpu_node_group: CpuNodeGroupSpec = Field(default_factory=CpuNodeGroupSpec)
    gpu_node_groups: list[GpuNodeGroupSpec] = Field(default_factory=list)
    pools: list[PoolSpec] = Field(min_length=1)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    tenants: list[TenantSpec] = Field(min_length=1)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    control_plane: ControlPlaneSpec = Field(default_factory=ControlPlaneSpec)
    images: ImagesSpec = Field(default_factory=ImagesSpec)
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    model_store: ModelStoreSpec = Field(default_factory=ModelStoreSpec)
    cost: CostSpec = Field(default_factory=CostSpec)
    aliases: dict[AliasName, AliasSpec] = Field(default_factory=dict)
    """Model names served by several pools by weight (canary rollouts), with a fallback pool."""

    def pool(self, name: str) -> PoolSpec:
        """The pool called ``name``; KeyError lists the pools that exist."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool {name!r}; pools: {', '.join(p.name for p in self.pools)}")

    def node_group(self, name: str) -> GpuNodeGroupSpec:
        for group in self.gpu_node_groups:
            if group.name == name:
                return group
        raise KeyError(f"no GPU node group {name!r}")

    def zones_of(self, group: GpuNodeGroupSpec) -> list[str]:
        return list(group.zones) if group.zones is not None else list(self.availability_zones)
