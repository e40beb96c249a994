"""FleetSpec: the typed model of a stack file's ``llmfleet:*`` keys.

Every runtime part (gateway, agent, autoscaler, simulator) and the Pulumi program read this one model.
Keys are camelCase in YAML (``gpuMemoryUtilization``) and snake_case in Python. Models are frozen and reject
unknown keys; cross-field checks that need the catalogue or the plugin registries live in `fleet.validate`.
"""

from __future__ import annotations

import re
from datetime import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

__all__ = [
    "AutoscalingSpec",
    "ClusterSpec",
    "ControlPlaneSpec",
    "CostSpec",
    "CpuNodeGroupSpec",
    "DrainSpec",
    "EngineSpec",
    "FleetSpec",
    "GatewaySpec",
    "GpuNodeGroupSpec",
    "ImagesSpec",
    "ModelFactsSpec",
    "PluginRef",
    "PoolSpec",
    "QueueSpec",
    "ReplicasSpec",
    "RestartWindowSpec",
    "RetrySpec",
    "RoutingSpec",
    "SimSpec",
    "SloSpec",
    "TenantSpec",
    "TimeoutSpec",
    "WorkloadSpec",
]

_NAME = r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=_NAME, description="lowercase DNS label: letters, digits, '-'")]
KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


class Spec(BaseModel):
    """Base of every spec model: frozen, camelCase aliases, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )


class PluginRef(Spec):
    """A plugin chosen by name with parameters, e.g. ``{name: queue-depth, weight: 2, params: {...}}``."""

    name: str
    weight: float = Field(default=1.0, ge=0.0, le=100.0)
    params: dict[str, Any] = Field(default_factory=dict)


class ClusterSpec(Spec):
    kubernetes_version: str = Field(default="1.33", pattern=r"^1\.\d{2}$")
    namespace: Name = "llmfleet"
    kubeconfig: str | None = None  # target=kubernetes: path or context of an existing cluster
    public_endpoint_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"])


class GpuNodeGroupSpec(Spec):
    """A GPU managed node group, created once per availability zone it spans."""

    name: Name
    instance_type: str
    zones: list[str] | None = None  # default: every zone of the stack
    min_nodes_per_az: int = Field(default=0, ge=0, le=100)
    max_nodes_per_az: int = Field(default=2, ge=0, le=100)
    capacity_type: Literal["on-demand", "spot", "capacity-block"] = "on-demand"
    root_volume_gib: int = Field(default=200, ge=50, le=16384)


class CpuNodeGroupSpec(Spec):
    """The CPU node group for gateways and the control plane, spread over every zone."""

    instance_type: str = "m6i.xlarge"
    min_nodes: int = Field(default=2, ge=1, le=100)
    max_nodes: int = Field(default=6, ge=1, le=100)


class ModelFactsSpec(Spec):
    """Overrides for a model that is not in the built-in catalogue."""

    parameters: float = Field(gt=0)
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = False
    max_position: int = Field(default=32768, gt=0)
    dtype: Literal["bfloat16", "float16", "fp8", "float32"] = "bfloat16"


class SimSpec(Spec):
    """Simulator-only settings (engine kind ``sim``)."""

    gpu_profile: str = "a100-80gb"
    time_scale: float = Field(default=1.0, gt=0.0, le=1000.0)  # >1 runs the model clock faster
    startup_seconds: float = Field(default=2.0, ge=0.0, le=3600.0)
    jitter: float = Field(default=0.0, ge=0.0, le=0.5)
    degradation_per_72h: float = Field(default=0.0, ge=0.0, le=0.9)
    seed: int = 0


class EngineSpec(Spec):
    kind: str = "vllm"
    version: str = "0.33.0"
    tensor_parallel_size: int = Field(default=1, ge=1, le=8)
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=0.98)
    max_model_len: int = Field(default=8192, ge=256, le=1_048_576)
    max_num_seqs: int = Field(default=256, ge=1, le=4096)
    max_num_batched_tokens: int = Field(default=2048, ge=16, le=262_144)
    enable_prefix_caching: bool = True
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    extra_args: list[str] = Field(default_factory=list)
    sim: SimSpec = Field(default_factory=SimSpec)


class ReplicasSpec(Spec):
    min: int = Field(default=1, ge=0, le=1000)
    max: int = Field(default=4, ge=1, le=1000)


class SloSpec(Spec):
    ttft_p99_ms: float = Field(default=300.0, gt=0, le=60_000)
    decode_tokens_per_s_p99: float = Field(default=30.0, gt=0, le=10_000)
    availability: float = Field(default=0.999, gt=0.9, lt=1.0)
    error_rate: float = Field(default=0.005, gt=0.0, lt=0.5)


class WorkloadSpec(Spec):
    mean_prompt_tokens: int = Field(default=200, ge=1, le=1_000_000)
    mean_output_tokens: int = Field(default=80, ge=1, le=1_000_000)
    cached_prompt_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    peak_qps: float = Field(default=10.0, ge=0.0, le=1_000_000)
    capacity_buffer: float = Field(default=0.3, ge=0.0, le=3.0)
    per_replica_qps: float | None = Field(default=None, gt=0)  # measured figure; overrides the model


class RestartWindowSpec(Spec):
    """A daily window in which replicas past ``minUptimeHours`` restart, ``maxUnavailable`` at a time."""

    enabled: bool = False
    start: time = time(3, 0)
    duration_minutes: int = Field(default=120, ge=1, le=1440)
    timezone: str = "UTC"
    min_uptime_hours: float = Field(default=24.0, ge=0.0, le=24 * 365)
    max_unavailable: int = Field(default=1, ge=1, le=100)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA time zone {value!r} (e.g. 'UTC', 'Europe/Berlin')") from exc
        return value


class DrainSpec(Spec):
    """Drain contract: stop routing, wait ``propagationSeconds``, then give the engine the rest of the grace."""

    grace_seconds: int = Field(default=120, ge=10, le=3600)
    propagation_seconds: float = Field(default=10.0, ge=0.0, le=300.0)

    @property
    def engine_shutdown_timeout(self) -> int:
        """vLLM ``--shutdown-timeout``: grace - preStop (propagation) - 5 s of margin for the SIGKILL."""
        return max(0, int(self.grace_seconds - self.propagation_seconds - 5))


class PoolSpec(Spec):
    name: Name
    model: str
    served_model_name: str | None = None
    model_facts: ModelFactsSpec | None = None
    node_group: str | None = None  # GPU node group; required on aws and kubernetes targets
    gpu: str | None = None  # GPU type when there is no node group (local, kubernetes)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    restart_window: RestartWindowSpec = Field(default_factory=RestartWindowSpec)
    drain: DrainSpec = Field(default_factory=DrainSpec)
    cold_start_seconds: float = Field(default=120.0, gt=0, le=3600)
    static_replicas: list[str] = Field(default_factory=list)  # engine URLs for a gateway without discovery

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @model_validator(mode="after")
    def _min_le_max(self) -> PoolSpec:
        if self.replicas.min > self.replicas.max:
            raise ValueError(f"replicas.min ({self.replicas.min}) must be <= replicas.max ({self.replicas.max})")
        return self


class QueueSpec(Spec):
    per_replica_threshold: int = Field(default=8, ge=0, le=10_000)
    max_waiting: int = Field(default=256, ge=0, le=1_000_000)
    timeout_s: float = Field(default=10.0, gt=0, le=600)


class TimeoutSpec(Spec):
    connect_s: float = Field(default=2.0, gt=0, le=60)
    first_token_s: float = Field(default=30.0, gt=0, le=600)
    total_s: float = Field(default=600.0, gt=0, le=7200)


class RetrySpec(Spec):
    max_attempts: int = Field(default=3, ge=1, le=10)
    budget_fraction: float = Field(default=0.2, ge=0.0, le=1.0)


class RoutingSpec(Spec):
    filters: list[PluginRef] = Field(default_factory=lambda: [PluginRef(name="ready"), PluginRef(name="serves-model")])
    scorers: list[PluginRef] = Field(
        default_factory=lambda: [PluginRef(name="queue-depth", weight=2.0), PluginRef(name="kv-usage")]
    )
    picker: PluginRef = Field(default_factory=lambda: PluginRef(name="p2c"))
    stale_after_s: float = Field(default=5.0, gt=0, le=300)
    scrape_interval_s: float = Field(default=0.5, gt=0, le=60)


class GatewaySpec(Spec):
    replicas: int = Field(default=2, ge=1, le=100)
    port: int = Field(default=8080, ge=1, le=65535)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    session_header: str = "x-session-id"
    queue: QueueSpec = Field(default_factory=QueueSpec)
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    quota_backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    public: bool = True


class TenantSpec(Spec):
    name: Name
    api_key_hashes: list[str] = Field(default_factory=list)  # "sha256:<hex>" of each key
    api_keys_secret: str | None = None  # Pulumi secret config key holding a list of keys
    priority: int = Field(default=1, ge=0, le=9)  # higher is served first
    requests_per_second: float = Field(default=10.0, gt=0, le=1_000_000)
    tokens_per_minute: int = Field(default=200_000, gt=0)
    max_concurrency: int = Field(default=32, ge=1, le=1_000_000)
    allowed_models: list[str] = Field(default_factory=lambda: ["*"])

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
    actuator: str = "local"
    dry_run: bool = False
    interval_s: float = Field(default=5.0, gt=0, le=600)
    target_queue_per_replica: float = Field(default=4.0, gt=0, le=10_000)
    target_kv_usage: float = Field(default=0.75, gt=0, le=1.0)
    target_utilisation: float = Field(default=0.75, gt=0, le=1.0)
    scale_up_stabilization_s: float = Field(default=0.0, ge=0, le=3600)
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86_400)
    max_scale_up_step: int = Field(default=4, ge=1, le=1000)
    max_scale_down_step: int = Field(default=1, ge=1, le=1000)
    predictive: bool = False


class ControlPlaneSpec(Spec):
    port: int = Field(default=8090, ge=1, le=65535)
    url: str | None = None  # where agents and gateways reach it; default derived per target
    report_interval_s: float = Field(default=1.0, gt=0, le=60)
    stale_after_s: float = Field(default=5.0, gt=0, le=600)
    lease_ttl_s: float = Field(default=600.0, gt=0, le=86_400)


class ImagesSpec(Spec):
    """Container images. ``engine`` runs ``llmfleet agent`` supervising vLLM (vLLM's image plus llmfleet);
    ``control`` runs the gateway, the control plane and simulator engines."""

    engine: str = "ghcr.io/llmfleet/llmfleet-vllm:0.1.0-vllm0.33.0"
    control: str = "ghcr.io/llmfleet/llmfleet:0.1.0"
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"


class CostSpec(Spec):
    gpu_hour_usd: float | None = Field(default=None, ge=0.0, le=1000.0)  # default: the GPU's catalogue price
    monthly_ceiling_usd: float | None = Field(default=None, ge=0.0)


class FleetSpec(Spec):
    """The whole fleet as declared in ``stacks/Pulumi.<env>.yaml`` (keys ``llmfleet:<key>``)."""

    environment: Name
    target: Literal["local", "kubernetes", "aws"]
    region: str = "us-east-1"
    availability_zones: list[str] = Field(min_length=1, max_length=6)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    cpu_node_group: CpuNodeGroupSpec = Field(default_factory=CpuNodeGroupSpec)
    gpu_node_groups: list[GpuNodeGroupSpec] = Field(default_factory=list)
    pools: list[PoolSpec] = Field(min_length=1)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    tenants: list[TenantSpec] = Field(min_length=1)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    control_plane: ControlPlaneSpec = Field(default_factory=ControlPlaneSpec)
    images: ImagesSpec = Field(default_factory=ImagesSpec)
    cost: CostSpec = Field(default_factory=CostSpec)

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
