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
    "DRAIN_MARGIN_S",
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

_NAME = r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=_NAME, description="lowercase DNS label: letters, digits, '-'")]
KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_DIGEST = r"^sha256:[0-9a-f]{64}$"
_ACM_ARN = r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]+$"
_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_KEY_PREFIX = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$"
# A registry host (and port) with an optional path, e.g. ghcr.io/acme/llmfleet: no tag, no digest.
_REGISTRY = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"


class Spec(BaseModel):
    """Base of every spec model: frozen, camelCase aliases, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
        use_attribute_docstrings=True,
    )


class PluginRef(Spec):
    """A plugin chosen by name with parameters, e.g. ``{name: queue-depth, weight: 2, params: {...}}``."""

    name: str
    weight: float = Field(default=1.0, ge=0.0, le=100.0)
    params: dict[str, Any] = Field(default_factory=dict)


class ClusterSpec(Spec):
    kubernetes_version: str = Field(default="1.33", pattern=r"^1\.\d{2}$")
    """EKS Kubernetes version."""
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
    """IAM roles of the CI that runs `pulumi up`, given cluster admin the same way, so a `pulumi up` by an identity
    other than the cluster's creator is not refused as Unauthorized."""
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
    root_volume_gib: int = Field(default=200, ge=50, le=16384)
    """Root volume size (model cache lives on the instance NVMe)."""


class CpuNodeGroupSpec(Spec):
    """The CPU node group for gateways and the control plane, spread over every zone."""

    instance_type: str = "m6i.xlarge"
    """Instance type of the CPU node group (gateways, control plane)."""
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
    time_scale: float = Field(default=1.0, gt=0.0, le=1000.0)
    """>1 runs the model clock faster."""
    startup_seconds: float = Field(default=2.0, ge=0.0, le=3600.0)
    jitter: float = Field(default=0.0, ge=0.0, le=0.5)
    degradation_per_72h: float = Field(default=0.0, ge=0.0, le=0.9)
    seed: int = 0


class EngineSpec(Spec):
    kind: str = "vllm"
    """Engine launcher: `vllm` or `sim` (the simulator)."""
    version: str = "0.33.0"
    """Engine release the agent builds arguments for."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=8)
    """GPUs per replica (`--tensor-parallel-size`)."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=0.98)
    """Fraction of GPU memory the engine may use (`--gpu-memory-utilization`)."""
    max_model_len: int = Field(default=8192, ge=256, le=1_048_576)
    """Longest prompt + output (`--max-model-len`)."""
    max_num_seqs: int = Field(default=256, ge=1, le=4096)
    """Most sequences in one batch (`--max-num-seqs`)."""
    max_num_batched_tokens: int = Field(default=2048, ge=16, le=262_144)
    """Token budget per engine step (`--max-num-batched-tokens`)."""
    enable_prefix_caching: bool = True
    """Automatic prefix caching (`--enable-prefix-caching`)."""
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    max_loras: int = Field(default=1, ge=1, le=64)
    """LoRA adapters in one batch (`--max-loras`): GPU slots reserved at start-up, each costing KV cache."""
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16
    """Largest adapter rank a slot holds (`--max-lora-rank`)."""
    max_cpu_loras: int | None = Field(default=None, ge=1, le=1024)
    """Adapters kept in host memory (`--max-cpu-loras`; default: `maxLoras`); others are read from disk again."""
    extra_args: list[str] = Field(default_factory=list)
    """Further engine arguments, appended verbatim."""
    sim: SimSpec = Field(default_factory=SimSpec)


class ReplicasSpec(Spec):
    min: int = Field(default=1, ge=0, le=1000)
    """Fewest replicas the autoscaler keeps."""
    max: int = Field(default=4, ge=1, le=1000)
    """Most replicas the autoscaler starts."""


class SloSpec(Spec):
    ttft_p99_ms: float = Field(default=300.0, gt=0, le=60_000)
    """Time to first token, 99th percentile."""
    decode_tokens_per_s_p99: float = Field(default=30.0, gt=0, le=10_000)
    """Per-stream decode speed the slowest 1% must still reach."""
    availability: float = Field(default=0.999, gt=0.9, lt=1.0)
    """Fraction of successful requests over 30 days."""
    error_rate: float = Field(default=0.005, gt=0.0, lt=0.5)
    """End-to-end error rate ceiling."""
    budget_window: str = Field(default="30d", pattern=r"^[1-9][0-9]{0,5}[mhd]$")
    """Error budget window: a whole number of minutes, hours or days (`30d`, `12h`, `90m`), at most 366 days."""
    freeze_on_exhausted_budget: bool = True
    """While any of the pool's error budgets is spent, refuse risky changes (planned-restart leases, rollouts)."""

    @property
    def budget_window_s(self) -> float:
        """`budget_window` in seconds."""
        return int(self.budget_window[:-1]) * {"m": 60.0, "h": 3600.0, "d": 86400.0}[self.budget_window[-1]]

    @model_validator(mode="after")
    def _window_at_most_a_year(self) -> SloSpec:
        if self.budget_window_s > 366 * 86400.0:
            raise ValueError(f"budgetWindow {self.budget_window!r} is longer than 366 days")
        return self


class WorkloadSpec(Spec):
    mean_prompt_tokens: int = Field(default=200, ge=1, le=1_000_000)
    """Mean prompt length of the traffic."""
    mean_output_tokens: int = Field(default=80, ge=1, le=1_000_000)
    """Mean output length of the traffic."""
    cached_prompt_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Share of prompt tokens expected to hit the prefix cache."""
    peak_qps: float = Field(default=10.0, ge=0.0, le=1_000_000)
    """Peak requests/s (e.g. from the last 90 days)."""
    capacity_buffer: float = Field(default=0.3, ge=0.0, le=3.0)
    """Head-room over the peak: replicas = ceil(peak / per-replica x (1 + buffer))."""
    per_replica_qps: float | None = Field(default=None, gt=0)
    """Measured figure; overrides the model."""


class RestartWindowSpec(Spec):
    """A daily window in which replicas past ``minUptimeHours`` restart, ``maxUnavailable`` at a time."""

    enabled: bool = False
    """Restart long-running engines in a daily window."""
    start: time = time(3, 0)
    """Window start, local time of `timezone`."""
    duration_minutes: int = Field(default=120, ge=1, le=1440)
    """Window length."""
    timezone: str = "UTC"
    """IANA time zone of `start`."""
    min_uptime_hours: float = Field(default=24.0, ge=0.0, le=24 * 365)
    """Restart only engines up at least this long."""
    max_unavailable: int = Field(default=1, ge=1, le=100)
    """Replicas of the pool restarting at once (restart leases)."""

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA time zone {value!r} (e.g. 'UTC', 'Europe/Berlin')") from exc
        return value


DRAIN_MARGIN_S = 5.0  # left between the end of a drain and the kubelet's SIGKILL


class DrainSpec(Spec):
    """Drain budget, waited once: stop routing, keep serving ``propagationSeconds`` while routers notice, then give
    the in-flight requests the rest: grace = propagation + shutdown timeout + 5 s margin."""

    grace_seconds: int = Field(default=120, ge=10, le=3600)
    """TerminationGracePeriodSeconds: the whole drain."""
    propagation_seconds: float = Field(default=10.0, ge=0.0, le=300.0)
    """Time for routers to stop sending new requests, after readiness falls and before in-flight ones are drained."""

    @property
    def shutdown_timeout(self) -> int:
        """Seconds in-flight requests get after the propagation delay (vLLM's ``--shutdown-timeout`` for engines,
        the gateway's ``--shutdown-timeout``): grace - propagation - margin."""
        return max(0, int(self.grace_seconds - self.propagation_seconds - DRAIN_MARGIN_S))

    @property
    def engine_shutdown_timeout(self) -> int:
        """vLLM ``--shutdown-timeout``: `shutdown_timeout`."""
        return self.shutdown_timeout


class AdapterSpec(Spec):
    """A LoRA adapter on the pool's base model, e.g. ``{name: sql, source: acme/qwen-7b-sql-lora}``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
    """The name clients send as `model` to use it."""
    source: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
    """Its id in the model store (`llmfleet model push --model ID`), else on the Hugging Face Hub."""
    revision: str = Field(default="main", pattern=_REVISION)
    rank: int = Field(default=16, ge=1, le=512)
    """Its LoRA rank (at most `engine.maxLoraRank`): the size of its weights, so its load time."""


class PoolSpec(Spec):
    name: Name
    """Pool name (Deployment and label value)."""
    model: str
    """Model id as the engine loads it (e.g. Qwen/Qwen2.5-7B-Instruct)."""
    served_model_name: str | None = None
    """The name clients send as `model` (default: model)."""
    model_revision: str = Field(default="main", pattern=_REVISION)
    """Revision the agent fetches from the model store (`llmfleet model push --revision`); use the Hub's name for
    it (commit, branch or tag) so that a Hub fallback loads the same weights."""
    model_facts: ModelFactsSpec | None = None
    """Model shape for the memory math when the model is not in the catalogue."""
    node_group: str | None = None
    """GPU node group; required on aws and kubernetes targets."""
    gpu: str | None = None
    """GPU type when there is no node group (local, kubernetes)."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    restart_window: RestartWindowSpec = Field(default_factory=RestartWindowSpec)
    drain: DrainSpec = Field(default_factory=DrainSpec)
    cold_start_seconds: float = Field(default=120.0, gt=0, le=3600)
    """Budget for an engine to become ready (weights, warm-up): the agent's deadline, the autoscaler's horizon."""
    static_replicas: list[str] = Field(default_factory=list)
    """Engine URLs for a gateway without discovery."""
    resume_streams: bool = False
    """When an engine fails mid-stream, the gateway continues the generation on another replica (vLLM's
    continue_final_message) and the client sees one stream; off: the stream ends with an error event."""
    adapters: list[AdapterSpec] = Field(default_factory=list)
    """LoRA adapters served on the base model (vLLM `--enable-lora --lora-modules`); a request names one as its
    `model`."""

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def runs_engine_image(self) -> bool:
        """Its pods run the engine image (vLLM); simulated and node-group-less pools run the runtime image."""
        return self.engine.kind != "sim" and self.node_group is not None

    @model_validator(mode="after")
    def _min_le_max(self) -> PoolSpec:
        if self.replicas.min > self.replicas.max:
            raise ValueError(f"replicas.min ({self.replicas.min}) must be <= replicas.max ({self.replicas.max})")
        return self

    @model_validator(mode="after")
    def _adapters_distinct(self) -> PoolSpec:
        names = [a.name for a in self.adapters]
        clash = sorted({n for n in names if names.count(n) > 1} | ({self.served_name} & set(names)))
        if clash:
            raise ValueError(f"adapter names must be distinct and differ from the served model name: {clash}")
        too_big = [a.name for a in self.adapters if a.rank > self.engine.max_lora_rank]
        if too_big:
            raise ValueError(f"adapters {too_big} have a rank above engine.maxLoraRank ({self.engine.max_lora_rank})")
        return self


class QueueSpec(Spec):
    per_replica_threshold: int = Field(default=8, ge=0, le=10_000)
    """Requests in flight per ready replica before new ones wait in the gateway queue."""
    max_waiting: int = Field(default=256, ge=0, le=1_000_000)
    """Waiting requests before 429."""
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    """Longest wait in the queue before 503."""


class TimeoutSpec(Spec):
    connect_s: float = Field(default=2.0, gt=0, le=60)
    """Connect timeout to an engine."""
    first_token_s: float = Field(default=30.0, gt=0, le=600)
    """Time to the first byte from the engine before 504."""
    total_s: float = Field(default=600.0, gt=0, le=7200)
    """Whole request."""
    header_read_s: float = Field(default=10.0, gt=0, le=300)
    """A client's request line and headers must arrive within this (slow-header clients are closed); also how
    long an idle keep-alive connection stays open."""
    body_read_s: float = Field(default=30.0, gt=0, le=600)
    """A client's request body must arrive within this, else 408."""


class RetrySpec(Spec):
    max_attempts: int = Field(default=3, ge=1, le=10)
    """Attempts per request, first included (retries only before the first byte)."""
    budget_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    """Retries allowed as a fraction of recent requests."""


class RoutingSpec(Spec):
    filters: list[PluginRef] = Field(
        default_factory=lambda: [
            PluginRef(name="ready"),
            PluginRef(name="serves-model"),
            PluginRef(name="serves-adapter"),
        ]
    )
    """Routing filters by name (ready, serves-model, serves-adapter, not-ejected, fresh-metrics)."""
    scorers: list[PluginRef] = Field(
        default_factory=lambda: [
            PluginRef(name="queue-depth", weight=2.0),
            PluginRef(name="kv-usage"),
            PluginRef(name="adapter-affinity"),
        ]
    )
    """Routing scorers by name and weight (queue-depth, kv-usage, in-flight, prefix-affinity, session-affinity,
    adapter-affinity)."""
    picker: PluginRef = Field(default_factory=lambda: PluginRef(name="p2c"))
    """Routing picker by name (p2c, max-score, random, round-robin)."""
    stale_after_s: float = Field(default=5.0, gt=0, le=300)
    """Engine metrics older than this are stale."""
    scrape_interval_s: float = Field(default=0.5, gt=0, le=60)
    """How often the gateway refreshes engine load."""


class QuotaRedisSpec(Spec):
    """The Redis the program provisions for ``quotaBackend: redis`` when ``redisUrl`` is unset."""

    node_type: str = Field(default="cache.t4g.small", pattern=r"^cache\.[a-z0-9]+\.[a-z0-9]+$")
    """ElastiCache node type (aws; two nodes in two zones)."""
    auth_token_secret: str = Field(default="quotaRedis:authToken", pattern=r"^[A-Za-z][A-Za-z0-9_-]*:[A-Za-z0-9_.-]+$")
    """Pulumi secret config key holding the Redis password (16 to 128 characters; no /, @ or double quote)."""


class GatewayTlsSpec(Spec):
    """TLS on the gateway's public listener: on aws the NLB terminates it with an ACM certificate; on kubernetes the
    gateway process does, from a ``kubernetes.io/tls`` Secret."""

    certificate_arn: str | None = Field(
        default=None, pattern=r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]+$"
    )
    """ACM certificate of the NLB's TLS listener (port 443); target aws."""
    secret_name: str | None = Field(default=None, pattern=_NAME)
    """Target kubernetes: a TLS Secret (tls.crt, tls.key) in the namespace; the gateway serves HTTPS with it."""
    source_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"])
    """Who may reach the public listener (the Service's loadBalancerSourceRanges)."""


_OTLP_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[^\s?#]*)?$")


class GatewayTracingSpec(Spec):
    """OpenTelemetry spans of every request's phases (docs/gateway.md, Tracing), sent over OTLP/HTTP."""

    otlp_endpoint: str | None = None
    """OTLP/HTTP collector, e.g. `http://otel-collector:4318` (spans go to its `/v1/traces`); unset: tracing off."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Fraction of new traces recorded; a caller's traceparent keeps its own sampling decision."""
    service_name: str = Field(default="llmfleet-gateway", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    """`service.name` of the gateway's spans."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not _OTLP_URL.match(value):
            raise ValueError(
                "expected the http:// or https:// URL of an OTLP/HTTP collector, e.g. http://otel-collector:4318"
            )
        return value


class GatewaySpec(Spec):
    replicas: int = Field(default=2, ge=1, le=100)
    """Gateway Deployment replicas."""
    port: int = Field(default=8080, ge=1, le=65535)
    """Gateway listen port."""
    admin_port: int = Field(default=8081, ge=1, le=65535)
    """Port of /metrics, /readyz and /healthz, plain HTTP; never behind the public Service."""
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    session_header: str = "x-session-id"
    """Request header carrying a session id for session affinity."""
    queue: QueueSpec = Field(default_factory=QueueSpec)
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    """Largest request body before 413."""
    quota_backend: Literal["memory", "redis"] = "memory"
    """Where tenant quotas are counted: per process or shared through Redis."""
    redis_url: str | None = None
    """Redis for shared quotas; on aws and kubernetes leave unset and the program provisions one."""
    redis: QuotaRedisSpec = Field(default_factory=QuotaRedisSpec)
    quota_store_down: Literal["fail-open", "fail-closed"] = "fail-open"
    """Redis unreachable: fail-open counts quotas in each gateway, each a share of the tenant's limits; fail-closed
    answers 503 with Retry-After. Either way a metric and a log line say so, and recovery is automatic."""
    public: bool = True
    """Expose the gateway through a public load balancer."""
    tls: GatewayTlsSpec = Field(default_factory=GatewayTlsSpec)
    drain: DrainSpec = Field(default_factory=lambda: DrainSpec(grace_seconds=615, propagation_seconds=10.0))
    """Gateway pod shutdown: keep serving propagationSeconds while the load balancer deregisters it, then finish
    in-flight requests within the rest of the grace (default: the longest request, timeouts.totalS)."""
    tracing: GatewayTracingSpec = Field(default_factory=GatewayTracingSpec)
    """Request spans exported over OTLP/HTTP (docs/gateway.md, Tracing); off unless `otlpEndpoint` is set."""

    @model_validator(mode="after")
    def _admin_port_apart(self) -> GatewaySpec:
        if self.admin_port == self.port:
            raise ValueError(f"adminPort ({self.admin_port}) must differ from port: /metrics stays off the public port")
        return self


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


class ObservabilitySpec(Spec):
    install_operator_crds: bool = True
    """Install the Prometheus Operator CRDs the SLO rules need; false when the cluster already runs the operator."""
    prometheus_namespace: Name = "monitoring"
    """Namespace of the Prometheus that scrapes the fleet: the network policies admit its pods to the engines'
    metrics ports (selected by the namespace's `kubernetes.io/metadata.name` label)."""
    grafana_dashboards: bool = True
    """Install the fleet's Grafana dashboards as ConfigMaps in `prometheusNamespace`, labelled for the Grafana
    dashboard sidecar (kube-prometheus-stack); false when that namespace does not exist or runs no Grafana."""


class ModelStoreSpec(Spec):
    """Where engines get their weights: the stack's model bucket (stack output ``modelBucket``, given to engine
    pods as ``LLMFLEET_MODEL_BUCKET``), filled by ``llmfleet model push``. A stack without a bucket (local)
    loads models as the engine always did."""

    prefix: str = Field(default="models", pattern=_KEY_PREFIX)
    """Key prefix in the bucket: a model lives under `<prefix>/<model id>/<revision>/`."""
    hub_fallback: bool = False
    """Load a pool's model from the Hugging Face Hub when the store cannot provide it (not pushed, unreachable,
    failed checksums); false: the agent fails with the reason instead."""


class CostSpec(Spec):
    gpu_hour_usd: float | None = Field(default=None, ge=0.0, le=1000.0)
    """Default: the GPU's catalogue price."""
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
