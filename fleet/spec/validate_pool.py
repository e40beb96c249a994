"""Validate pool: one pool's placement, memory fit, engine limits, workload and operations against the catalogue.

Part of `fleet.spec.validate.check_spec`. The checks run in order and the first group stops early: a pool whose
node group, GPU or model is unknown cannot be sized, so nothing after it is checked (and an unknown instance type
is reported once, on its node group).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from fleet.capacity.catalog import GIB, GPUS, INSTANCES, MODELS
from fleet.capacity.perf import kv_bytes_per_token
from fleet.capacity.plan import (
    ACTIVATION_RESERVE_GIB,
    KV_BLOCK_TOKENS,
    concurrency_that_fits,
    kv_budget_bytes,
    model_facts,
    plan_pool,
    pool_gpu,
    weight_bytes,
)
from fleet.spec.errors import Problem, key_error as _err, key_warning as _warn
from fleet.spec.stack import DRAIN_MARGIN_S, FleetSpec, PoolSpec

__all__ = ["check_pool"]


def check_pool(spec: FleetSpec, index: int, pool: PoolSpec) -> Iterator[Problem]:
    """Every problem of ``spec.pools[index]``, in the order the pool's keys are explained."""
    path = f"pools[{index}]"
    blocking = _placement(spec, path, pool)
    if blocking is not None:
        yield from blocking
        return
    if spec.target == "aws" and pool.engine.kind == "sim":
        yield _warn(f"{path}.engine.kind", "simulated engines on GPU nodes serve no real tokens")
    problems, kv_tokens = _kv_fit(spec, path, pool)
    yield from problems
    if kv_tokens is None:
        return
    yield from _engine_limits(path, pool, kv_tokens)
    engine, work = pool.engine, pool.workload
    mean_context = work.mean_prompt_tokens + work.mean_output_tokens
    if mean_context > engine.max_model_len:
        yield _err(
            f"{path}.workload.meanPromptTokens",
            f"prompt + output ({work.mean_prompt_tokens}+{work.mean_output_tokens}) exceeds maxModelLen "
            f"{engine.max_model_len}",
        )
        return
    fits = concurrency_that_fits(kv_tokens // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS, mean_context, engine.max_num_seqs)
    if fits < engine.max_num_seqs:
        yield _warn(
            f"{path}.engine.maxNumSeqs",
            f"{engine.max_num_seqs} sequences of {mean_context} tokens exceed the KV budget "
            f"({kv_tokens} tokens); about {fits} fit before preemption",
        )
    yield from _operations(spec, path, pool)
    yield from _sleep_memory(spec, path, pool)
    if pool.engine.kv_events and not pool.engine.enable_prefix_caching:
        yield _err(
            f"{path}.engine.kvEvents",
            "the engine publishes KV-cache events from its prefix cache, which enablePrefixCaching: false turns "
            "off; allowed: true only with enablePrefixCaching: true, else false",
            True,
        )


def _placement(spec: FleetSpec, path: str, pool: PoolSpec) -> list[Problem] | None:
    """The problem that stops the pool's other checks, which need its node group, GPU and model facts: None when
    there is none, [] when its node group's own check reports it."""
    groups = {g.name for g in spec.gpu_node_groups}
    if pool.node_group is not None and pool.node_group not in groups:
        known = ", ".join(g.name for g in spec.gpu_node_groups) or "none declared"
        return [_err(f"{path}.nodeGroup", f"no such GPU node group; gpuNodeGroups: {known}", pool.node_group)]
    if pool.node_group is None and spec.target == "aws":
        return [_err(f"{path}.nodeGroup", "required on target 'aws': name one of gpuNodeGroups")]
    if pool.node_group is not None and spec.node_group(pool.node_group).instance_type not in INSTANCES:
        return []  # reported on the node group
    if pool.gpu is not None and pool.gpu not in GPUS:
        return [_err(f"{path}.gpu", f"unknown GPU; catalogue: {', '.join(GPUS)}", pool.gpu)]
    profile = pool.engine.sim.gpu_profile
    if profile not in GPUS:
        return [_err(f"{path}.engine.sim.gpuProfile", f"unknown GPU profile; catalogue: {', '.join(GPUS)}", profile)]
    if pool.model_facts is None and pool.model not in MODELS:
        return [
            _err(
                f"{path}.model",
                f"not in the model catalogue ({', '.join(MODELS)}); add llmfleet:{path}.modelFacts",
                pool.model,
            )
        ]
    return None


def _kv_fit(spec: FleetSpec, path: str, pool: PoolSpec) -> tuple[list[Problem], int | None]:
    """The tokens of KV cache one replica holds, or None (with the reason) when the model does not fit its GPUs."""
    engine = pool.engine
    facts = model_facts(pool)
    gpu = pool_gpu(spec, pool)
    tp = engine.tensor_parallel_size
    if pool.node_group is not None:
        per_node = INSTANCES[spec.node_group(pool.node_group).instance_type].gpu_count
        if tp > per_node or per_node % tp:
            why = f"must divide the node's {per_node} GPUs and be at most {per_node}"
            return [_err(f"{path}.engine.tensorParallelSize", why, tp)], None
    budget = kv_budget_bytes(gpu, facts, tp, engine.gpu_memory_utilization)
    if budget <= 0:
        need = facts.parameters * 2 / GIB / tp + ACTIVATION_RESERVE_GIB
        problem = _err(
            f"{path}.engine.tensorParallelSize",
            f"the model does not fit: it needs ~{need:.1f} GiB per GPU at TP {tp} but {gpu.name} offers "
            f"{gpu.memory_gib * engine.gpu_memory_utilization:.1f} GiB at gpuMemoryUtilization "
            f"{engine.gpu_memory_utilization}; raise TP or use a larger GPU",
            tp,
        )
        return [problem], None
    return [], int(budget // kv_bytes_per_token(facts))


def _engine_limits(path: str, pool: PoolSpec, kv_tokens: int) -> Iterator[Problem]:
    """maxModelLen within the model's context and the KV cache; a batch at least one token per sequence."""
    engine = pool.engine
    max_position = model_facts(pool).max_position
    if engine.max_model_len > max_position:
        yield _err(
            f"{path}.engine.maxModelLen", f"must be <= the model's context length {max_position}", engine.max_model_len
        )
    if kv_tokens < engine.max_model_len:
        yield _err(
            f"{path}.engine.maxModelLen",
            f"one full-length sequence needs {engine.max_model_len} tokens of KV but only {kv_tokens} fit",
            engine.max_model_len,
        )
    if engine.max_num_batched_tokens < engine.max_num_seqs:
        yield _err(
            f"{path}.engine.maxNumBatchedTokens",
            f"must be >= maxNumSeqs ({engine.max_num_seqs})",
            engine.max_num_batched_tokens,
        )


def _operations(spec: FleetSpec, path: str, pool: PoolSpec) -> Iterator[Problem]:
    """The restart window, the drain, the capacity plan's reach and the memory left for other processes."""
    window = pool.restart_window
    if window.enabled and window.max_unavailable >= max(1, pool.replicas.min):
        yield _warn(
            f"{path}.restartWindow.maxUnavailable",
            f"{window.max_unavailable} of a minimum of {pool.replicas.min} replicas may restart at once",
        )
    if pool.engine.responses_store and pool.engine.runner == "pooling":
        yield _err(
            f"{path}.engine.responsesStore",
            "a pooling engine serves no /v1/responses; allowed: true only with engine.runner generate",
            True,
        )
    if pool.drain.propagation_seconds + DRAIN_MARGIN_S >= pool.drain.grace_seconds:
        yield _err(
            f"{path}.drain.graceSeconds",
            f"must exceed propagationSeconds + {DRAIN_MARGIN_S:g} "
            f"({pool.drain.propagation_seconds + DRAIN_MARGIN_S:g})",
            pool.drain.grace_seconds,
        )
    for note in plan_pool(spec, pool).notes:
        if "cannot reach" in note:
            yield _warn(f"{path}.workload.peakQps", note)
    if math.isclose(pool.engine.gpu_memory_utilization, 0.98):
        yield _warn(f"{path}.engine.gpuMemoryUtilization", "0.98 leaves no room for other processes on the GPU")


def _sleep_memory(spec: FleetSpec, path: str, pool: PoolSpec) -> Iterator[Problem]:
    """Sleep mode keeps each sleeping replica's weights in its node's host memory: a node of the pool's group must
    hold the weights of as many replicas as fit on its GPUs (the catalogue's host memory per instance type)."""
    if not pool.engine.sleep_mode:
        return
    if pool.node_group is None:
        return
    instance = INSTANCES[spec.node_group(pool.node_group).instance_type]
    per_node = instance.gpu_count // pool.engine.tensor_parallel_size
    need_gib = per_node * weight_bytes(model_facts(pool)) / GIB
    if need_gib > instance.memory_gib:
        yield _err(
            f"{path}.engine.sleepMode",
            f"a {instance.name} node has {instance.memory_gib} GiB of host memory, but its {per_node} sleeping "
            f"replicas would keep {need_gib:.0f} GiB of weights there; allowed: true only where the weights fit, "
            "else false",
            True,
        )
