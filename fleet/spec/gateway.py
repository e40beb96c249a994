"""Gateway spec: ``llmfleet:gateway``: ports, admission queue, timeouts, retries, routing plugins, quotas, TLS and
tracing."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from fleet.spec.base import _NAME, PluginRef, Spec
from fleet.spec.pool import DrainSpec

__all__ = [
    "GatewaySpec",
    "GatewayTlsSpec",
    "GatewayTracingSpec",
    "QueueSpec",
    "QuotaRedisSpec",
    "RetrySpec",
    "RoutingSpec",
    "TimeoutSpec",
]


class QueueSpec(Spec):
    per_replica_threshold: int = Field(default=8, ge=0, le=10_000)
    """Requests in flight per ready replica before new ones wait in the gateway queue."""
    max_waiting: int = Field(default=256, ge=0, le=1_000_000)
    """Waiting requests before 429."""
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    """Longest wait in the queue before 503."""
    hold_for_capacity_s: float = Field(default=0.0, ge=0, le=1800)
    """Longest wait for a pool with no ready replica (scaled to zero, or every replica starting) before 503 with
    Retry-After; such a request also makes the gateway report to the control plane at once. Set it to the pool's
    cold start to serve from zero; 0: timeoutS."""


class TimeoutSpec(Spec):
    connect_s: float = Field(default=2.0, gt=0, le=60)
    """Connect timeout to an engine."""
    first_token_s: float = Field(default=30.0, gt=0, le=600)
    """Time to the first byte from the engine before 504."""
    total_s: float = Field(default=600.0, gt=0, le=7200)
    """Whole request."""
    header_read_s: float = Field(default=10.0, gt=0, le=300)
    """A client's request line and headers must arrive within this, from the connection's first byte or the end of
    its previous answer, on both listeners, else the connection is closed; also how long an idle keep-alive
    connection stays open."""
    body_read_s: float = Field(default=30.0, gt=0, le=600)
    """A client's request body must arrive within this, else 408 and the connection is closed; a body no route
    reads (a GET's, or one answered early) is read and dropped for at most this long before the connection
    closes."""


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


_HOSTNAME = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$"
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
    hostname: str | None = Field(default=None, max_length=253, pattern=_HOSTNAME)
    """The DNS name clients use (the one the TLS certificate names), pointed at the load balancer; the stack's
    gatewayUrl output is https://<hostname>. Unset: gatewayUrl is the load balancer's own name."""
    tls: GatewayTlsSpec = Field(default_factory=GatewayTlsSpec)
    drain: DrainSpec = Field(default_factory=lambda: DrainSpec(grace_seconds=725, propagation_seconds=120.0))
    """Gateway pod shutdown (default: graceSeconds 725, propagationSeconds 120): keep serving propagationSeconds
    while the load balancer deregisters it (an NLB keeps sending new connections for about 120 s), then finish
    in-flight requests within the rest of the grace (by default the longest request, timeouts.totalS)."""
    tracing: GatewayTracingSpec = Field(default_factory=GatewayTracingSpec)
    """Request spans exported over OTLP/HTTP (docs/gateway.md, Tracing); off unless `otlpEndpoint` is set."""

    @model_validator(mode="after")
    def _admin_port_apart(self) -> GatewaySpec:
        if self.admin_port == self.port:
            raise ValueError(f"adminPort ({self.admin_port}) must differ from port: /metrics stays off the public port")
        return self
