"""Pool spec: one engine pool's keys (``llmfleet:pools[]``): model, engine, replicas, SLOs, workload, restart
window, drain, LoRA adapters."""

from __future__ import annotations

from datetime import time
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from fleet.spec.base import _REVISION, Name, Spec
from fleet.spec.disagg import PREFILL_SUFFIX, DisaggregationSpec

__all__ = [
    "DRAIN_MARGIN_S",
    "AdapterSpec",
    "DrainSpec",
    "EngineSpec",
    "ModelFactsSpec",
    "PoolSpec",
    "ReplicasSpec",
    "RestartWindowSpec",
    "SimSpec",
    "SloSpec",
    "WorkloadSpec",
]


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


_MAX_CPU_KV_CACHE_GIB = 4096


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
    runner: Literal["generate", "pooling"] = "generate"
    """vLLM's `--runner`: `pooling` serves `/v1/embeddings` (an embedding model, or a generative one vLLM converts)
    and no generation route, `generate` the reverse. The gateway sends embeddings only to pooling pools and chat and
    completions only to generative ones; a request for the other kind is a 400 naming the pool's runner. The
    capacity plan (and so the scaler's request-rate term) counts a pooling pool's request as its prompt's prefill
    alone: `workload.meanOutputTokens` is not generated."""
    responses_store: bool = False
    """vLLM keeps what `/v1/responses` answers (`VLLM_ENABLE_RESPONSES_API_STORE=1` in the engine's environment), so
    `GET /v1/responses/{id}`, `previous_response_id`, `background` and `cancel` work; the gateway sends each of them
    to the replica holding the response. Off (vLLM's default), a response is not kept and those requests get 404
    (`background`: 400). vLLM keeps stored responses in the engine's memory and never expires them: a replica's
    restart (its restart windows among them) forgets them all. Generative pools only."""
    sleep_mode: bool = False
    """Warm standby: the agent starts the engine with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`. A scale-down
    then puts ready replicas to sleep at level 1 (weights to host memory, KV cache freed) instead of stopping them,
    as long as the pool holds at most `replicas.max` awake and asleep, and a scale-up wakes sleeping replicas (about
    a second) before it starts new ones (a cold start). Needs host memory for the weights of every sleeping replica
    on a node. Off: replicas only start and stop."""
    kv_events: bool = False
    """The engine publishes its KV-cache events (`--kv-events-config`: every block it caches or evicts, over a ZMQ
    PUB socket on port 5557 on a cluster, a free port locally) with the topic `kv@<replica>@<servedModelName>`, and
    the replica's reports name the socket (`kv_events_url`), so gateways may subscribe. Needs
    `enablePrefixCaching`: the events come from the prefix cache."""
    tokenizer: str | None = None
    """A folder holding the model's tokenizer (`tokenizer.json`, and the chat template in `chat_template.jinja` or
    `tokenizer_config.json`): the engine's `--tokenizer`, and what gateways tokenize prompts with for the
    `kv-cache` scorer, so both count the same tokens. A relative path is from the directory the engine and gateway
    run in (the repository root locally). Unset: the engine reads the tokenizer with the model. Then on aws a gateway
    that routes the pool by `kv-cache` (with `kvEvents`) fetches the model's own tokenizer files, as the manifest of
    `model` at `modelRevision` lists them, from the stack's model bucket when it starts, and checks their sha256. If
    it cannot (not pushed, no `tokenizer.json`, a checksum mismatch, the bucket unreachable) it logs why, starts
    anyway and exports `llmfleet_gateway_prompt_tokens_available{pool}` 0: `kv-cache` then scores nothing for the
    pool, as on the other targets."""
    cpu_kv_cache_gib: int = Field(default=1, ge=1, le=_MAX_CPU_KV_CACHE_GIB)
    """vLLM on a host without a GPU (the agent finds none with `nvidia-smi`): GiB of host memory for the KV cache,
    as `VLLM_CPU_KVCACHE_SPACE` in the engine's environment unless the agent's own environment sets it. The agent
    then passes no `--gpu-memory-utilization`, which vLLM on CPU reads as a share of the host's memory (0.9: most of
    the machine, so a second replica could not start), and no `--enable-sleep-mode`, with which it refuses to
    start. Ignored on GPU hosts and by the simulator, except on the `cpu-tiny` profile (the CPU build simulated)."""
    sim: SimSpec = Field(default_factory=SimSpec)

    @field_validator("cpu_kv_cache_gib", mode="before")
    @classmethod
    def _whole_gib(cls, value: object) -> object:
        # vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): 1.5, "2" or true would fail only when an engine starts.
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_CPU_KV_CACHE_GIB:
            raise ValueError(
                "GiB of host memory for the KV cache of vLLM on CPU (VLLM_CPU_KVCACHE_SPACE); "
                f"allowed: a whole number from 1 to {_MAX_CPU_KV_CACHE_GIB}"
            )
        return value


class ReplicasSpec(Spec):
    min: int = Field(default=1, ge=0, le=1000)
    """Fewest replicas the autoscaler keeps."""
    max: int = Field(default=4, ge=1, le=1000)
    """Most replicas the autoscaler starts."""
    fill_paid_nodes: bool = True
    """On a target paid by the node (aws), never run fewer replicas than the node group's minimum nodes
    (`minNodesPerAz` x zones) hold: their GPUs are paid whether they serve or not. The pools on one node group
    share them, each at most `max`: split once, or every tick by what each wants where the group's `paidSplit` is
    `demand` (docs/operations.md, the paid floor guard-rail). Off: the autoscaler may go down to `min`. No effect
    on local targets."""


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
    disaggregation: DisaggregationSpec | None = None
    """Prefill long prompts on other engines (`fleet.spec.disagg`): this pool's replicas then decode, and its
    `<name>-prefill` role pool prefills. Unset: every replica prefills and decodes its own requests."""
    _role: Literal["serving", "prefill"] = PrivateAttr(default="serving")

    @property
    def role(self) -> Literal["aggregated", "decode", "prefill"]:
        """What the pool's engines do: `aggregated` (a pool without `disaggregation`), `decode` (one with it), or
        `prefill` (the role pool `prefill_pool` derives)."""
        if self._role == "prefill":
            return "prefill"
        return "aggregated" if self.disaggregation is None else "decode"

    def prefill_pool(self) -> PoolSpec | None:
        """The pool of this pool's prefill replicas, ``<name>-prefill``: the same model and engine but for the
        prefill role's replicas, tensor parallelism, version and static replicas, with no adapters, restart
        window of its own or further disaggregation. None for a pool without `disaggregation`."""
        pd = self.disaggregation
        if pd is None or self._role == "prefill":
            return None
        role = pd.prefill
        engine = self.engine.model_copy(
            update={
                "tensor_parallel_size": role.tensor_parallel_size or self.engine.tensor_parallel_size,
                "version": role.version or self.engine.version,
            }
        )
        replicas = self.replicas.model_copy(update={"min": role.replicas.min, "max": role.replicas.max})
        derived = self.model_copy(
            update={
                "name": self.name + PREFILL_SUFFIX,
                "engine": engine,
                "replicas": replicas,
                "static_replicas": list(role.static_replicas),
                "resume_streams": False,
            }
        )
        derived._role = "prefill"
        return derived

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
