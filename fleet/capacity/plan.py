"""Capacity: pure functions from a pool's model, GPU, engine arguments and token mix to a replica plan.

The seed's rule ``required = ceil(peak_qps / per_replica_qps * (1 + buffer))`` is applied with a per-replica
QPS derived from the token mix: a replica's capacity is the request rate at which its engine, stepping at the
speed the per-stream decode SLO demands, still fits every request's prompt and output tokens. The seed's
"50 QPS per replica" therefore holds only for requests of about 250-300 uncached tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleet.capacity.catalog import DTYPE_BYTES, GIB, GPUS, INSTANCES, MODELS, GpuType, ModelFacts, instance_hour_usd
from fleet.capacity.lora import lora_slot_bytes
from fleet.capacity.perf import StepTimeModel, kv_bytes_per_token
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = [
    "ACTIVATION_RESERVE_GIB",
    "HOURS_PER_MONTH",
    "KV_BLOCK_TOKENS",
    "PoolPlan",
    "concurrency_that_fits",
    "gpu_hour_usd",
    "kv_budget_bytes",
    "lora_reserve_bytes",
    "model_facts",
    "monthly_cost_usd",
    "output_tokens",
    "per_replica_qps",
    "plan_pool",
    "pool_gpu",
    "required_replicas",
    "step_model",
    "weight_bytes",
]

# Activations, CUDA graphs and the sampler take this much per GPU beyond weights (vLLM profiles it at start).
ACTIVATION_RESERVE_GIB = 2.5
KV_BLOCK_TOKENS = 16
HOURS_PER_MONTH = 730.0


def model_facts(pool: PoolSpec) -> ModelFacts:
    """The pool's model facts: its ``modelFacts`` override, else the built-in catalogue entry."""
    if pool.model_facts is not None:
        return ModelFacts(**pool.model_facts.model_dump())
    return MODELS[pool.model]


def pool_gpu(spec: FleetSpec, pool: PoolSpec) -> GpuType:
    """The GPU a pool's replicas run on: its node group's instance GPU, else ``gpu``, else the sim profile."""
    if pool.node_group is not None:
        return GPUS[INSTANCES[spec.node_group(pool.node_group).instance_type].gpu]
    if pool.gpu is not None:
        return GPUS[pool.gpu]
    return GPUS[pool.engine.sim.gpu_profile]


def step_model(spec: FleetSpec, pool: PoolSpec) -> StepTimeModel:
    return StepTimeModel(model_facts(pool), pool_gpu(spec, pool), pool.engine.tensor_parallel_size)


def weight_bytes(model: ModelFacts) -> float:
    """Bytes of weights: parameters x bytes per parameter (7.6e9 BF16 -> 15.2e9 B = 14.1 GiB)."""
    return model.parameters * DTYPE_BYTES[model.dtype]


def kv_budget_bytes(gpu: GpuType, model: ModelFacts, tensor_parallel: int, utilization: float) -> float:
    """KV-cache bytes of one replica: its GPUs' memory x utilisation - weights - activation reserve.

    Negative when the model does not fit at this tensor parallelism.
    """
    usable = gpu.memory_gib * GIB * utilization * tensor_parallel
    return usable - weight_bytes(model) - ACTIVATION_RESERVE_GIB * GIB * tensor_parallel


def lora_reserve_bytes(pool: PoolSpec) -> float:
    """GPU memory a replica of ``pool`` reserves for LoRA slots before sizing its KV cache (0 without adapters)."""
    if not pool.adapters:
        return 0.0
    return lora_slot_bytes(model_facts(pool), pool.engine.max_loras, pool.engine.max_lora_rank)


def concurrency_that_fits(kv_tokens: int, mean_context: int, max_num_seqs: int) -> int:
    """Sequences of ``mean_context`` tokens that fit in ``kv_tokens``, capped by ``max_num_seqs``."""
    blocks_per_seq = math.ceil(mean_context / KV_BLOCK_TOKENS)
    return max(0, min(max_num_seqs, (kv_tokens // KV_BLOCK_TOKENS) // max(1, blocks_per_seq)))


def required_replicas(peak_qps: float, per_replica_qps: float, buffer: float) -> int:
    """``ceil(peak / per_replica * (1 + buffer))``; 200 QPS at 50 per replica with buffer 0.3 -> 6."""
    if peak_qps <= 0:
        return 0
    # Round away float noise first so that exact products (100 / 50 * 1.5 = 3) are not pushed up by one.
    return math.ceil(round(peak_qps / per_replica_qps * (1.0 + buffer), 9))


def per_replica_qps(
    model: StepTimeModel,
    prompt_tokens: int,
    output_tokens: int,
    decode_tokens_per_s: float,
    max_concurrency: int,
    cached_prompt_fraction: float = 0.0,
) -> float:
    """Requests/s one replica sustains while each stream still decodes at ``decode_tokens_per_s``.

    Steady state at rate L with step time t = 1 / decode_tokens_per_s: each step decodes B = L * O * t streams
    (Little's law) and prefills L * P_uncached * t prompt tokens, so it computes N = L * t * (P_u + O) tokens
    while reading B * (P + O / 2) context tokens of KV. The answer is the largest L whose step still fits in t
    and whose B fits ``max_concurrency``.
    """
    step_budget = 1.0 / decode_tokens_per_s
    uncached = prompt_tokens * (1.0 - cached_prompt_fraction)
    mean_ctx = prompt_tokens + output_tokens / 2.0

    def fits(rate: float) -> bool:
        batch = rate * output_tokens * step_budget
        tokens = rate * step_budget * (uncached + output_tokens)
        step = model.step_seconds(max(1, round(tokens)), decode_context_tokens=round(batch * mean_ctx))
        return step <= step_budget and batch <= max_concurrency

    if not fits(1e-6):
        return 0.0
    lo, hi = 0.0, 1.0
    while fits(hi) and hi < 1e7:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def gpu_hour_usd(spec: FleetSpec, pool: PoolSpec, gpu: GpuType) -> float:
    """Catalogue price per GPU-hour of ``pool``'s GPUs: its node group's instance in the stack's region (spot at
    its on-demand ceiling unless a spot price is recorded), else the GPU's own (an existing cluster's GPUs)."""
    if pool.node_group is not None:
        group = spec.node_group(pool.node_group)
        price = instance_hour_usd(group.instance_type, spec.region, group.capacity_type)
        if price is not None and group.instance_type in INSTANCES:
            return price.usd / INSTANCES[group.instance_type].gpu_count
    return gpu.hour_usd


def monthly_cost_usd(gpus: int, gpu_hour_usd: float) -> float:
    return gpus * gpu_hour_usd * HOURS_PER_MONTH


@dataclass(frozen=True)
class PoolPlan:
    """What one pool needs, derived from the spec; ``notes`` are plain-language warnings."""

    pool: str
    model: str
    gpu: str
    gpus_per_replica: int
    weight_gib: float
    kv_bytes_per_token: int
    kv_budget_gib: float
    kv_tokens: int
    mean_context: int
    concurrency_per_replica: int
    per_replica_qps: float
    qps_source: str  # "token mix" or "stack" (a measured figure from workload.perReplicaQps)
    peak_qps: float
    replicas_min: int
    replicas_needed: int
    replicas_peak: int  # needed, clamped to [min, max]
    replicas_max: int
    zones: list[str]
    nodes_per_az_peak: int
    gpus_peak: int
    monthly_cost_min_usd: float
    monthly_cost_peak_usd: float
    idle_prefill_ms: float
    notes: list[str] = field(default_factory=list)


def plan_pool(spec: FleetSpec, pool: PoolSpec) -> PoolPlan:
    """The capacity plan of one pool (assumes the spec passed `fleet.spec.validate.check_spec`)."""
    facts = model_facts(pool)
    gpu = pool_gpu(spec, pool)
    engine = pool.engine
    tp = engine.tensor_parallel_size
    steps = StepTimeModel(facts, gpu, tp)
    kv_per_token = kv_bytes_per_token(facts)
    budget = kv_budget_bytes(gpu, facts, tp, engine.gpu_memory_utilization) - lora_reserve_bytes(pool)
    kv_tokens = max(0, int(budget // kv_per_token) // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS)
    work = pool.workload
    mean_context = work.mean_prompt_tokens + output_tokens(pool)
    concurrency = concurrency_that_fits(kv_tokens, mean_context, engine.max_num_seqs)
    notes: list[str] = []
    qps, source, needed = _replicas_needed(pool, steps, concurrency, gpu.name, notes)
    peak = min(max(needed, pool.replicas.min), pool.replicas.max)
    if concurrency < engine.max_num_seqs:
        notes.append(
            f"maxNumSeqs {engine.max_num_seqs} x mean context {mean_context} tokens exceeds the KV cache "
            f"({kv_tokens} tokens); about {concurrency} sequences fit before preemption"
        )
    idle_prefill = steps.prefill_seconds(
        round(work.mean_prompt_tokens * (1 - work.cached_prompt_fraction)), engine.max_num_batched_tokens
    )
    if idle_prefill * 1000 > pool.slo.ttft_p99_ms:
        notes.append(
            f"an idle prefill of the mean prompt takes {idle_prefill * 1000:.0f} ms, above the TTFT p99 SLO "
            f"of {pool.slo.ttft_p99_ms:g} ms"
        )
    nodes = _Nodes.of(spec, pool, gpu)
    return PoolPlan(
        pool=pool.name,
        model=pool.model,
        gpu=gpu.name,
        gpus_per_replica=tp,
        weight_gib=weight_bytes(facts) / GIB,
        kv_bytes_per_token=kv_per_token,
        kv_budget_gib=budget / GIB,
        kv_tokens=kv_tokens,
        mean_context=mean_context,
        concurrency_per_replica=concurrency,
        per_replica_qps=qps,
        qps_source=source,
        peak_qps=work.peak_qps,
        replicas_min=pool.replicas.min,
        replicas_needed=needed,
        replicas_peak=peak,
        replicas_max=pool.replicas.max,
        zones=nodes.zones,
        nodes_per_az_peak=nodes.per_az(peak),
        gpus_peak=peak * tp,
        monthly_cost_min_usd=nodes.monthly_cost(pool.replicas.min),
        monthly_cost_peak_usd=nodes.monthly_cost(peak),
        idle_prefill_ms=idle_prefill * 1000,
        notes=notes,
    )


def output_tokens(pool: PoolSpec) -> int:
    """The tokens a request of ``pool`` generates on average: none on a pooling engine (``engine.runner:
    pooling``, embeddings), whose requests are their prompts' prefill alone, else the workload's mean."""
    return 0 if pool.engine.runner == "pooling" else pool.workload.mean_output_tokens


def _replicas_needed(
    pool: PoolSpec, steps: StepTimeModel, concurrency: int, gpu: str, notes: list[str]
) -> tuple[float, str, int]:
    """(per-replica QPS, where it comes from, replicas the peak needs); appends to ``notes`` what stops the plan."""
    work = pool.workload
    if work.per_replica_qps is not None:
        qps, source = work.per_replica_qps, "stack"
    else:
        qps = per_replica_qps(
            steps,
            work.mean_prompt_tokens,
            output_tokens(pool),
            pool.slo.decode_tokens_per_s_p99,
            max(1, concurrency),
            work.cached_prompt_fraction,
        )
        source = "token mix"
    if qps <= 0:
        needed = pool.replicas.max
        notes.append(
            f"one replica cannot decode at {pool.slo.decode_tokens_per_s_p99:g} tok/s per stream on {gpu} "
            "even at batch 1: lower decodeTokensPerSP99 or use a faster GPU"
        )
    else:
        needed = required_replicas(work.peak_qps, qps, work.capacity_buffer)
    if needed > pool.replicas.max:
        notes.append(
            f"peak {work.peak_qps:g} QPS with a {work.mean_prompt_tokens}+{output_tokens(pool)}-token mix "
            f"needs {needed} replicas (at {qps:.1f} QPS each, buffer {work.capacity_buffer:g}) but "
            f"replicas.max is {pool.replicas.max}: the pool cannot reach its target"
        )
    return qps, source, needed


@dataclass(frozen=True)
class _Nodes:
    """How a pool's replicas land on nodes: spread evenly over ``zones`` (topology spread), whole nodes per zone,
    at least ``min_per_az`` each; without a node group every replica is billed its own GPUs."""

    zones: list[str]
    replicas_per_node: int
    gpus_per_node: int
    min_per_az: int
    on_node_group: bool
    gpus_per_replica: int
    hour_usd: float

    @classmethod
    def of(cls, spec: FleetSpec, pool: PoolSpec, gpu: GpuType) -> _Nodes:
        replicas_per_node, gpus_per_node = _replicas_per_node(spec, pool)
        min_per_az = 0 if pool.node_group is None else spec.node_group(pool.node_group).min_nodes_per_az
        hour = spec.cost.gpu_hour_usd if spec.cost.gpu_hour_usd is not None else gpu_hour_usd(spec, pool, gpu)
        return cls(
            _pool_zones(spec, pool),
            replicas_per_node,
            gpus_per_node,
            min_per_az,
            pool.node_group is not None,
            pool.engine.tensor_parallel_size,
            hour,
        )

    def per_az(self, replicas: int) -> int:
        per_zone = math.ceil(replicas / len(self.zones)) if self.zones else replicas
        return max(self.min_per_az, math.ceil(per_zone / self.replicas_per_node) if self.replicas_per_node else 0)

    def monthly_cost(self, replicas: int) -> float:
        if not self.on_node_group:
            return monthly_cost_usd(replicas * self.gpus_per_replica, self.hour_usd)
        used_zones = len(self.zones) if self.min_per_az else min(len(self.zones), replicas)
        return monthly_cost_usd(self.per_az(replicas) * used_zones * self.gpus_per_node, self.hour_usd)


def _pool_zones(spec: FleetSpec, pool: PoolSpec) -> list[str]:
    if pool.node_group is None:
        return list(spec.availability_zones)
    return spec.zones_of(spec.node_group(pool.node_group))


def _replicas_per_node(spec: FleetSpec, pool: PoolSpec) -> tuple[int, int]:
    if pool.node_group is None:
        return 1, pool.engine.tensor_parallel_size
    instance = INSTANCES[spec.node_group(pool.node_group).instance_type]
    return instance.gpu_count // pool.engine.tensor_parallel_size, instance.gpu_count


def admission_capacity(ready_replicas: int, max_num_seqs: int, per_replica_threshold: int) -> int:
    """Requests a pool admits in flight: ready replicas x (``maxNumSeqs`` + ``queue.perReplicaThreshold``), a
    batch each plus a short engine queue; the gateways, the control plane and the simulation all use it."""
    return max(0, ready_replicas) * (max_num_seqs + per_replica_threshold)
