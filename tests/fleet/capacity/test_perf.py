"""The step-time model matches the published Qwen2.5-7B / A100-80GB calibration points within 10%."""

from __future__ import annotations

import pytest

from fleet.capacity.catalog import MODELS
from fleet.capacity.perf import StepTimeModel

QWEN = MODELS["Qwen/Qwen2.5-7B-Instruct"]


@pytest.mark.parametrize(
    ("batch", "target_tok_s"),
    [(1, 85.0), (32, 2500.0), (256, 8000.0)],
)
def test_decode_throughput_matches_calibration(batch: int, target_tok_s: float) -> None:
    model = StepTimeModel.for_names(QWEN, "a100-80gb")
    assert model.decode_tokens_per_s(batch, context=1024) == pytest.approx(target_tok_s, rel=0.10)


def test_idle_512_token_prefill_takes_about_40_ms() -> None:
    model = StepTimeModel.for_names(QWEN, "a100-80gb")
    assert model.prefill_seconds(512) == pytest.approx(0.040, rel=0.10)


@pytest.mark.parametrize(("gpu", "faster"), [("h100-80gb", True), ("h200-141gb", True), ("cpu-demo", False)])
def test_other_gpus_scale_by_bandwidth_and_flops(gpu: str, faster: bool) -> None:
    a100 = StepTimeModel.for_names(QWEN, "a100-80gb").step_seconds(64)
    other = StepTimeModel.for_names(QWEN, gpu).step_seconds(64)
    assert (other < a100) is faster


def test_tensor_parallel_shortens_steps() -> None:
    one = StepTimeModel.for_names(QWEN, "a100-80gb", 1).step_seconds(512)
    two = StepTimeModel.for_names(QWEN, "a100-80gb", 2).step_seconds(512)
    assert two < one


def test_an_idle_step_costs_nothing() -> None:
    assert StepTimeModel.for_names(QWEN, "a100-80gb").step_seconds(0) == 0.0


def test_max_tokens_per_step_inverts_step_seconds() -> None:
    model = StepTimeModel.for_names(QWEN, "a100-80gb")
    n = model.max_tokens_per_step(1 / 30)
    assert model.step_seconds(n) <= 1 / 30 < model.step_seconds(n + 1)
