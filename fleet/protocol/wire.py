"""Wire: the JSON bodies exchanged between agents, the control plane and gateways.

agent -> control plane   POST /v1/reports                LoadReport
gateway -> control plane POST /v1/gateway-reports        GatewayReport (the admission queue: demand not yet
                                                         in any engine)
gateway -> control plane GET  /v1/pools/{pool}/replicas  ReplicaList
gateway -> control plane GET  /v1/aliases                AliasWeights (the aliases' weights now: rollouts move them)
operator -> control plane POST/GET/DELETE /v1/rollouts   RolloutStart -> RolloutStatus, RolloutsResponse
agent -> control plane   POST /v1/leases/restart         LeaseRequest -> LeaseGrant (409 when refused)
                         DELETE /v1/leases/restart/{pool}/{replica}   -> Released

Both report endpoints answer `Accepted`; a gateway's report is answered with `GatewayAccepted`, which carries the
gateway's share of the pool's admission capacity. The operators' views of the control plane (`PoolsResponse`,
`LeasesResponse`, `DecisionsResponse`) are here too, so its OpenAPI document names every body it sends.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "Accepted",
    "LATENCY_EDGES_S",
    "AgentState",
    "AliasEntry",
    "AliasWeights",
    "DecisionsResponse",
    "GatewayAccepted",
    "GatewayReport",
    "RATE_WINDOW_S",
    "ReplicaState",
    "LeaseGrant",
    "LeaseRequest",
    "LeasesResponse",
    "LoadReport",
    "PoolBudget",
    "PoolOutcomes",
    "Released",
    "ReplicaInfo",
    "ReplicaList",
    "RolloutSide",
    "RolloutStart",
    "RolloutStatus",
    "RolloutsResponse",
    "StartPhases",
    "SloBudget",
]


class ReplicaState(enum.StrEnum):
    """A replica's state, one enum for the agent (its state machine, `agent.states`), the control plane and the
    simulator. A str enum: on the wire and in JSON it is its value (``"ready"``), and it compares equal to it."""

    LAUNCHING = "launching"  # the control plane's only: started by the actuator, no report from its agent yet
    FETCHING = "fetching"  # model weights from the store into the node cache; no engine yet
    STARTING = "starting"  # engine spawned; connection refused is expected until the cold-start deadline
    WARMING = "warming"  # /health answers; a warm-up completion must succeed before routing
    READY = "ready"  # serving; the only state in which the agent's /readyz is 200
    SLEEPING = "sleeping"  # not routable; the engine leaves routing, then sleeps (level 1: weights in host memory)
    WAKING = "waking"  # not routable; the engine wakes and must answer its greedy check as before sleep
    DRAINING = "draining"  # not routable; in-flight requests finish, then the engine stops
    STOPPED = "stopped"  # engine stopped for good; the agent exits
    RESTARTING = "restarting"  # engine down; waiting out the crash backoff before a respawn
    FAILED = "failed"  # crash loop: no restarts until an operator resets or the crash window passes


def _reported(state: ReplicaState) -> ReplicaState:
    if state is ReplicaState.LAUNCHING:
        raise ValueError("launching is the control plane's state for a replica no agent has reported yet")
    return state


AgentState = Annotated[ReplicaState, AfterValidator(_reported)]
"""A state an agent reports: any `ReplicaState` but ``launching``."""


class Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# What a load report may say (else 400 naming the field): far beyond any real engine, so only a broken or hostile
# reporter meets a bound, and nothing downstream (the scaler's sums, the gauges, gateways' routing) sees a negative
# count, a NaN or 1e308.
MAX_COUNT = 1_000_000  # requests waiting or running in one engine; restarts of one replica
MAX_TOKENS_PER_S = 100_000_000.0  # one engine's generation rate
MAX_SECONDS = 10_000_000_000.0  # a time since the epoch (year 2286), an uptime, a latency, a phase of a start
Count = Annotated[float, Field(ge=0, le=MAX_COUNT, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=253)]  # a replica or pool: a Kubernetes object name's limit
Text = Annotated[str, Field(max_length=2048)]  # a URL, a model name, an engine version


class StartPhases(Wire):
    """The current or last engine start, phase by phase (`agent.starts`); None for a phase not seen in it."""

    started_at: Seconds = Field(description="Unix time the start began: its model fetch, else the engine's launch")
    fetch_s: Seconds | None = Field(description="the agent's model fetch; None without one in this start")
    load_s: Seconds | None = Field(description="the engine's model load into GPU memory, from its log")
    compile_s: Seconds | None = Field(description="torch.compile (Dynamo and Inductor), from the engine's log")
    graphs_s: Seconds | None = Field(description="CUDA graph capture, from the engine's log (whole seconds)")
    ready_s: Seconds | None = Field(description="launch to the engine's first healthy /health, the agent's clock")


class LoadReport(Wire):
    """What an agent pushes about once a second. Load fields are None when the last scrape failed. Every field is
    bounded (`MAX_COUNT`, `MAX_SECONDS`, fractions in [0, 1], no NaN or infinity, names and URLs of sane length)."""

    replica: Name
    pool: Name
    engine_url: Text
    agent_url: Text | None = None
    kv_events_url: Text | None = Field(default=None, description="the engine's KV-cache event socket (kvEvents)")
    role: Literal["aggregated", "decode", "prefill"] = Field(
        default="aggregated", description="what the engine does in its pool: prefill and decode pools run P/D"
    )
    side_channel: Text | None = Field(
        default=None, description="a prefill or decode engine's NIXL handshake listener, host:port"
    )
    state: AgentState
    waiting: Count | None = None
    running: Count | None = None
    kv_usage: Fraction | None = None
    ttft_p99_s: Seconds | None = None
    tokens_per_s: Annotated[float, Field(ge=0.0, le=MAX_TOKENS_PER_S, allow_inf_nan=False)] | None = None
    prefix_hit_rate: Fraction | None = Field(
        default=None, description="recent prompt tokens served from the prefix cache"
    )
    model: Text
    engine_version: Text
    uptime_s: Seconds = 0.0
    restarts: int = Field(default=0, ge=0, le=MAX_COUNT)
    start: StartPhases | None = Field(default=None, description="the engine's current or last start, by phase")
    # The agent's clock is not trusted (arrival times are the control plane's): any finite time of sane size.
    ts: float = Field(
        ge=-MAX_SECONDS,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="agent wall-clock time of the report, seconds since the epoch",
    )


# Upper bounds (seconds) of the latency buckets gateways count TTFT and TPOT in: about x1.5 apart, so a p99 read
# from them (linear inside a bucket) is within a few percent, well inside a canary's 10% tolerance.
LATENCY_EDGES_S: tuple[float, ...] = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip


class PoolOutcomes(Wire):
    """Requests a gateway answered for one pool since its previous accepted report: counts by outcome, and TTFT
    and TPOT (streams only: a whole answer has no token timing) as counts per `LATENCY_EDGES_S` bucket, the last
    count above the last edge; an empty list: none measured."""

    ok: int = Field(default=0, ge=0)
    client_errors: int = Field(default=0, ge=0, description="4xx answers (the client's doing, 499 included)")
    errors: int = Field(default=0, ge=0, description="5xx answers")
    ttft: list[int] = Field(default_factory=list)
    tpot: list[int] = Field(default_factory=list)

    @field_validator("ttft", "tpot")
    @classmethod
    def _buckets(cls, counts: list[int]) -> list[int]:
        if counts and (len(counts) != len(LATENCY_EDGES_S) + 1 or min(counts) < 0):
            raise ValueError(f"{len(LATENCY_EDGES_S) + 1} non-negative counts (one per latency bucket) or none")
        return counts

    @property
    def answered(self) -> int:
        return self.ok + self.client_errors + self.errors


RATE_WINDOW_S = 10.0
"""The window a gateway's ``arrived_per_s`` is a mean over (the simulator's gateway uses the same): a step in
demand reaches the control plane spread over this long, which the scaler's own windows must leave room for."""


class GatewayReport(Wire):
    """What a gateway pushes about each pool about once a second: its admission queue and request rates.

    Requests waiting here are in no engine yet, so no agent reports them. Rates are over the gateway's recent
    window (``window_s``); ``arrived_per_s`` counts every request for the pool (admitted, queued or refused).
    """

    gateway: str
    pool: str
    waiting: int = Field(ge=0)
    in_flight: int = Field(ge=0)
    arrived_per_s: float = Field(ge=0.0)
    admitted_per_s: float = Field(ge=0.0)
    window_s: float = Field(default=0.0, ge=0.0)
    ts: float = Field(description="gateway wall-clock time of the report, seconds since the epoch")
    demand: dict[int, int] = Field(
        default_factory=dict,
        description="requests in flight or waiting at this gateway, by tenant priority (the capacity shares' input)",
    )
    outcomes: PoolOutcomes = Field(
        default_factory=PoolOutcomes, description="answers since the previous accepted report (canary rollouts)"
    )


class ReplicaInfo(Wire):
    """One replica as the control plane knows it; ``stale`` when its last report is too old."""

    replica: str
    pool: str
    engine_url: str
    state: AgentState
    stale: bool
    last_report: LoadReport


class ReplicaList(Wire):
    pool: str
    model: str
    replicas: list[ReplicaInfo]
    generated_at: float


class LeaseRequest(Wire):
    pool: str
    replica: str
    ttl_s: float | None = None  # default: the control plane's leaseTtlS


class LeaseGrant(Wire):
    pool: str
    replica: str
    expires_at: float
    holders: list[str]


class Accepted(Wire):
    """The answer to a report: taken, and how long the control plane trusts it."""

    accepted: bool
    stale_after_s: float


class GatewayAccepted(Accepted):
    """The answer to a gateway's report: ``admission_share`` is the fraction of the pool's admission capacity this
    gateway may admit (`control_plane.shares`), None when the control plane knows no capacity for the pool yet;
    ``gateways`` counts the live gateways it was divided among."""

    admission_share: float | None = Field(default=None, ge=0.0, le=1.0)
    gateways: int = Field(default=1, ge=1)


class Released(Wire):
    """The answer to a lease release: False when the replica held no lease (it had expired, or never was)."""

    released: bool


class LeasesResponse(Wire):
    """Restart leases: holders per pool (replica -> expiry time) and the recent grant/renew/refuse/release/expire
    events, oldest first."""

    holders: dict[str, dict[str, float]]
    history: list[dict[str, Any]]


class DecisionsResponse(Wire):
    """Scaling decisions, oldest first, each with its inputs and reason."""

    decisions: list[dict[str, Any]]


class SloBudget(Wire):
    """One SLO's error budget over the pool's window, as `fleet.slo.budget.Budget` computes it."""

    slo: Literal["availability", "ttft", "error-rate"]
    target: float = Field(description="success ratio the SLO asks for (0.999, 0.99 for TTFT's p99)")
    window: str = Field(description="slo.budgetWindow, e.g. 30d")
    good: float
    bad: float
    total: float = Field(description="requests counted: those inside planned restart windows are left out")
    excluded_requests: float = Field(description="requests answered inside planned restart windows")
    excluded_s: float = Field(description="seconds of planned restart windows inside the counted span")
    covered_s: float = Field(description="seconds of the window the counts span")
    burn_rate: float = Field(description="error ratio / allowed error ratio (1.0 spends the budget in the window)")
    spent: float = Field(description="fraction of the window's budget spent (1.0: all of it)")
    remaining: float
    status: Literal["ok", "intervene", "exhausted"]


class PoolBudget(Wire):
    """``GET /v1/pools/{pool}/budget``: the pool's error budgets and whether risky changes may go ahead."""

    pool: str
    source: str = Field(description="budget source the counts come from (local, prometheus)")
    computed_at: float | None = Field(description="when the counts were last read; None: not yet")
    error: str | None = Field(default=None, description="the source's last failure, while it lasts")
    freeze: bool = Field(description="slo.freezeOnExhaustedBudget")
    allows_changes: bool = Field(description="False while an exhausted budget freezes restarts and rollouts")
    reason: str
    slos: list[SloBudget]


class AliasEntry(Wire):
    """One alias as gateways serve it: pool -> weight, the fallback pool, stickiness (`fleet.spec.stack.AliasSpec`)."""

    pools: dict[str, int]
    fallback: str | None = None
    sticky: Literal["session", "none"] = "session"


class AliasWeights(Wire):
    """``GET /v1/aliases``: every alias's weights now (the stack's, as rollouts have moved them since)."""

    aliases: dict[str, AliasEntry]
    generated_at: float


class RolloutStart(Wire):
    """``POST /v1/rollouts``: roll ``alias`` from its baseline (the stack's ``rollout.baseline``, else its pool of
    highest weight) to ``candidate``."""

    alias: str
    candidate: str


class RolloutSide(Wire):
    """One pool's SLIs over the current step's window."""

    pool: str
    requests: int
    errors: int
    error_rate: float | None
    ttft_p99_s: float | None
    tpot_p99_s: float | None


class RolloutStatus(Wire):
    """A canary rollout as `rollout.canary` runs it: the step, the weights, and the window it is judged on."""

    alias: str
    baseline: str
    candidate: str
    phase: Literal["baking", "promoted", "rolled-back", "aborted"]
    steps: list[int]
    step: int = Field(description="index into steps of the current weight")
    weight: int = Field(description="the candidate's percent of the alias now")
    weights: dict[str, int]
    bake_s: float
    min_samples: int
    tolerance: float
    metrics: list[str] = Field(description="what each step is judged on: TTFT p99, TPOT p99, error rate")
    started_at: float
    step_started_at: float = Field(description="start of the window the step is judged on")
    reason: str = Field(description="the last decision's reason: why it holds, stepped, rolled back or promoted")
    window: list[RolloutSide] = Field(description="baseline then candidate, over the window so far")


class RolloutsResponse(Wire):
    """``GET /v1/rollouts``: each alias's rollout, running or the last finished one."""

    rollouts: list[RolloutStatus]
