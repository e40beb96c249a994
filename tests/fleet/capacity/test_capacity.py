"""The capacity model reproduces the seed's memory figures and derives per-replica QPS from the token mix."""

from __future__ import annotations

import pytest

from fleet.capacity.catalog import GIB, GPUS, MODELS, ModelFacts
from fleet.capacity.perf import StepTimeModel, kv_bytes_per_token
from fleet.capacity.plan import (
    concurrency_that_fits,
    kv_budget_bytes,
    per_replica_qps,
    plan_pool,
    required_replicas,
    weight_bytes,
)
from fleet.spec.loader import load_spec, parse_spec
from tests.support.stacks import stack_document

QWEN = MODELS["Qwen/Qwen2.5-7B-Instruct"]
A100 = StepTimeModel.for_names(QWEN, "a100-80gb")


def test_weights_of_7_6e9_bf16_parameters_are_14_1_gib() -> None:
    facts = ModelFacts(7.6e9, 28, 3584, 4, 128, 152064, False, 32768)
    assert weight_bytes(facts) / GIB == pytest.approx(14.16, abs=0.01)


def test_qwen_kv_is_56_kib_per_token_and_448_mb_for_8192_tokens() -> None:
    assert kv_bytes_per_token(QWEN) == 56 * 1024
    assert kv_bytes_per_token(QWEN) * 8192 / 1024**2 == 448


def test_kv_budget_of_an_a100_80gb_holds_about_a_million_tokens() -> None:
    budget = kv_budget_bytes(GPUS["a100-80gb"], QWEN, 1, 0.9)
    assert 54 * GIB < budget < 57 * GIB
    assert 0.95e6 < budget / kv_bytes_per_token(QWEN) < 1.1e6


def test_a_model_that_does_not_fit_has_a_negative_budget() -> None:
    assert kv_budget_bytes(GPUS["a10g-24gb"], MODELS["meta-llama/Llama-3.1-8B-Instruct"], 1, 0.5) < 0


@pytest.mark.parametrize(
    ("peak", "per_replica", "buffer", "expected"),
    [
        (200, 50, 0.3, 6),  # the seed's worked example
        (100, 50, 0.5, 3),  # an exact product is not pushed up by float noise
        (0, 50, 0.3, 0),
        (1, 50, 0.3, 1),
        (1000, 46, 0.4, 31),
    ],
)
def test_required_replicas(peak: float, per_replica: float, buffer: float, expected: int) -> None:
    assert required_replicas(peak, per_replica, buffer) == expected


@pytest.mark.parametrize(
    ("kv_tokens", "context", "max_seqs", "expected"),
    [(1_000_000, 8000, 1024, 125), (1_000_000, 280, 256, 256), (100, 8000, 4, 0)],
)
def test_concurrency_that_fits(kv_tokens: int, context: int, max_seqs: int, expected: int) -> None:
    assert concurrency_that_fits(kv_tokens, context, max_seqs) == expected


def test_fifty_qps_per_replica_holds_only_for_short_requests() -> None:
    """The seed's 50 QPS fits ~250-300 uncached tokens per request; a 512+256 mix gets far less."""
    short = per_replica_qps(A100, 200, 80, decode_tokens_per_s=30, max_concurrency=256)
    long = per_replica_qps(A100, 512, 256, decode_tokens_per_s=30, max_concurrency=256)
    assert 40 <= short <= 60
    assert long < 50 / 2  # 50 QPS of 512+256 needs 2-3 A100s


def test_prefix_cache_hits_raise_capacity() -> None:
    cold = per_replica_qps(A100, 1000, 100, 30, 256)
    warm = per_replica_qps(A100, 1000, 100, 30, 256, cached_prompt_fraction=0.8)
    assert warm > 1.5 * cold


def test_prod_plan_needs_six_replicas_for_200_qps() -> None:
    loaded = load_spec("prod")
    plan = plan_pool(loaded.spec, loaded.spec.pools[0])
    assert plan.replicas_needed == 6
    assert plan.gpus_peak == 6
    assert plan.nodes_per_az_peak == 1
    assert plan.monthly_cost_peak_usd == pytest.approx(3 * 27.44705 * 730)  # p4de on demand, us-east-1


def test_plan_says_when_the_mix_cannot_reach_the_target() -> None:
    loaded = parse_spec(
        stack_document(
            "aws",
            **{
                "llmfleet:pools.0.workload": {
                    "meanPromptTokens": 512,
                    "meanOutputTokens": 256,
                    "peakQps": 400,
                },
                "llmfleet:pools.0.replicas": {"min": 3, "max": 6},
            },
        )
    )
    plan = plan_pool(loaded.spec, loaded.spec.pools[0])
    assert plan.replicas_peak == 6
    assert any("cannot reach its target" in note for note in plan.notes)
    assert any(w.path == "llmfleet:pools[0].workload.peakQps" for w in loaded.warnings)


def test_a_measured_per_replica_qps_overrides_the_model() -> None:
    loaded = parse_spec(
        stack_document(
            "aws", **{"llmfleet:pools.0.workload": {"peakQps": 200, "perReplicaQps": 50, "capacityBuffer": 0.3}}
        )
    )
    plan = plan_pool(loaded.spec, loaded.spec.pools[0])
    assert (plan.qps_source, plan.replicas_needed) == ("stack", 6)


def test_an_embedding_pool_pays_its_prompts_prefill_only() -> None:
    # The same 200+80 mix and 200 QPS: pooling, a request is its 200-token prefill, no decode, no output's KV.
    generative = load_spec("prod").spec
    pooling = parse_spec(stack_document("aws", **{"llmfleet:pools.0.engine.runner": "pooling"})).spec
    gen, embed = plan_pool(generative, generative.pools[0]), plan_pool(pooling, pooling.pools[0])
    assert embed.mean_context == pooling.pools[0].workload.mean_prompt_tokens
    assert embed.per_replica_qps > gen.per_replica_qps  # ~13,000 prefill tokens/s on an A100: 67 QPS of 200
    assert embed.replicas_needed < gen.replicas_needed
