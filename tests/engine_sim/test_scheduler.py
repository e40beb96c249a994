"""The pure step model: batching, chunked prefill, preemption, prefix caching, timing, calibration."""

from __future__ import annotations

import pytest

from engine_sim.request import FinishReason, RequestStatus, SimRequest
from engine_sim.timing import StepTimer, StepWork
from fleet.capacity.perf import StepTimeModel
from tests.engine_sim.builders import make_config, make_request, make_scheduler, run_until_idle, unique_prompt


def test_one_request_prefills_then_decodes_one_token_per_step() -> None:
    sched = make_scheduler()
    req = make_request(100, max_tokens=5)
    sched.add(req, now=0.0)
    end, results = run_until_idle(sched)
    assert [len(r.plan.scheduled) for r in results] == [1] * 5
    assert [r.plan.work.num_tokens for r in results] == [100, 1, 1, 1, 1]
    assert req.finish_reason is FinishReason.LENGTH and req.num_output_tokens == 5
    assert req.first_token_time == results[0].plan.end
    assert sched.kv_usage == 0.0 and sched.stats.generation_tokens == 5 and sched.stats.prompt_tokens == 100


def test_long_prompt_is_chunked_by_the_token_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=256)
    req = make_request(1000, max_tokens=1)
    sched.add(req, 0.0)
    _, results = run_until_idle(sched)
    assert [r.plan.work.num_tokens for r in results] == [256, 256, 256, 232]
    assert [len(r.events) for r in results] == [0, 0, 0, 1]


def test_decodes_are_scheduled_before_a_new_prefill_which_gets_the_leftover_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=64)
    decoding = make_request(10, max_tokens=50)
    sched.add(decoding, 0.0)
    sched.step(0.0)  # prefill: now decoding
    sched.add(make_request(500, max_tokens=1), 1.0)
    plan = sched.schedule(1.0)
    assert plan is not None
    assert [(r.request_id, n) for r, n in plan.scheduled][0] == (decoding.request_id, 1)
    assert plan.scheduled[1][1] == 63


def test_a_long_prompt_slows_other_requests_decode_steps() -> None:
    sched = make_scheduler()
    streams = [make_request(50, max_tokens=40) for _ in range(4)]
    for r in streams:
        sched.add(r, 0.0)
    now = sched.step(0.0).plan.end  # type: ignore[union-attr]
    quiet = sched.step(now)
    assert quiet is not None
    sched.add(make_request(4000, max_tokens=1), quiet.plan.end)
    busy = sched.step(quiet.plan.end)
    assert busy is not None and busy.plan.work.num_tokens == 2048
    assert busy.plan.duration > 5 * quiet.plan.duration


def test_max_num_seqs_caps_the_running_batch() -> None:
    sched = make_scheduler(max_num_seqs=3)
    for _ in range(5):
        sched.add(make_request(20, max_tokens=4), 0.0)
    sched.step(0.0)
    assert (sched.num_running, sched.num_waiting) == (3, 2)
    run_until_idle(sched)
    assert sched.num_running == sched.num_waiting == 0


def test_kv_exhaustion_preempts_the_last_running_request_which_is_recomputed_later() -> None:
    # 8 blocks (128 tokens) of KV; four requests of 24 prompt + 40 output tokens need 16 blocks.
    sched = make_scheduler(num_gpu_blocks_override=8, max_model_len=128)
    reqs = [make_request(24, max_tokens=40) for _ in range(4)]
    for r in reqs:
        sched.add(r, 0.0)
    peak_usage, saw_preemption_step = 0.0, False
    now = 0.0
    while sched.has_work():
        result = sched.step(now)
        assert result is not None
        now = result.plan.end
        peak_usage = max(peak_usage, sched.kv_usage)
        if result.plan.preempted:
            saw_preemption_step = True
            assert result.plan.preempted[0] is reqs[-1] or result.plan.preempted[0].num_preemptions >= 1
            # No waiting request is admitted in a step that preempted.
            assert all(r.status is RequestStatus.RUNNING for r, _ in result.plan.scheduled)
    assert saw_preemption_step and sched.stats.preemptions >= 1 and peak_usage == 1.0
    assert all(r.finish_reason is FinishReason.LENGTH and r.num_output_tokens == 40 for r in reqs)
    assert sched.kv_usage == 0.0


def test_a_repeated_prefix_hits_the_cache_and_prefills_faster() -> None:
    sched = make_scheduler()
    shared = unique_prompt(1600)
    first = make_request(shared + unique_prompt(20), max_tokens=1)
    sched.add(first, 0.0)
    t1, _ = run_until_idle(sched)
    second = make_request(shared + unique_prompt(20), max_tokens=1)
    sched.add(second, t1)
    t2, _ = run_until_idle(sched, t1)
    assert second.num_cached_tokens == 1600 and first.num_cached_tokens == 0
    assert sched.stats.prefix_hits == 1600 and sched.stats.prefix_queries == 2 * 1620
    ttft_first = first.first_token_time - first.arrival_time  # type: ignore[operator]
    ttft_second = second.first_token_time - second.arrival_time  # type: ignore[operator]
    assert ttft_second < ttft_first / 3


def test_prefix_caching_off_never_hits() -> None:
    sched = make_scheduler(enable_prefix_caching=False)
    shared = unique_prompt(320)
    for _ in range(2):
        sched.add(make_request(list(shared), max_tokens=1), 0.0)
        run_until_idle(sched)
    assert sched.stats.prefix_hits == 0


@pytest.mark.parametrize(
    ("stop_after", "max_tokens", "reason", "n_out"),
    [(None, 8, FinishReason.LENGTH, 8), (5, 8, FinishReason.STOP, 5), (9, 8, FinishReason.LENGTH, 8)],
)
def test_finish_reasons(stop_after: int | None, max_tokens: int, reason: FinishReason, n_out: int) -> None:
    sched = make_scheduler()
    req = make_request(10, max_tokens=max_tokens, stop_after=stop_after)
    sched.add(req, 0.0)
    run_until_idle(sched)
    assert (req.finish_reason, req.num_output_tokens) == (reason, n_out)


def test_max_tokens_is_clamped_to_the_model_length() -> None:
    sched = make_scheduler(max_model_len=300, num_gpu_blocks_override=100)
    req = make_request(290, max_tokens=1000)
    sched.add(req, 0.0)
    run_until_idle(sched)
    assert req.num_output_tokens == 10 and req.finish_reason is FinishReason.LENGTH


def test_a_prompt_as_long_as_the_model_length_is_rejected() -> None:
    sched = make_scheduler(max_model_len=256, num_gpu_blocks_override=100)
    with pytest.raises(ValueError):
        sched.add(make_request(256), 0.0)


def test_abort_during_a_step_frees_blocks_and_the_step_skips_the_request() -> None:
    sched = make_scheduler()
    req = make_request(100, max_tokens=10)
    sched.add(req, 0.0)
    plan = sched.schedule(0.0)
    assert plan is not None and sched.kv_usage > 0
    assert sched.abort(req.request_id, 0.001) is req
    assert sched.kv_usage == 0.0 and req.finish_reason is FinishReason.ABORT
    assert sched.complete(plan).events == ()
    assert sched.abort(req.request_id, 0.002) is None


def test_duplicate_request_ids_are_rejected() -> None:
    sched = make_scheduler()
    sched.add(SimRequest("same", [1, 2, 3], 4), 0.0)
    with pytest.raises(ValueError):
        sched.add(SimRequest("same", [1, 2, 3], 4), 0.0)


def test_jitter_is_seeded_and_mean_preserving() -> None:
    model = make_config().step_model
    work = StepWork(32, decode_context_tokens=32 * 1024)
    a = [StepTimer(model, jitter=0.1, seed=7).seconds(work) for _ in range(3)]
    timer, again = StepTimer(model, jitter=0.1, seed=7), StepTimer(model, jitter=0.1, seed=7)
    assert [timer.seconds(work) for _ in range(200)] == [again.seconds(work) for _ in range(200)]
    samples = [timer.seconds(work) for _ in range(4000)]
    base = model.step_seconds(32, 32 * 1024)
    assert abs(sum(samples) / len(samples) / base - 1.0) < 0.02
    assert len(set(a)) == 1  # each fresh timer with the same seed starts the same way


@pytest.mark.parametrize(("uptime_h", "factor"), [(0, 1.0), (36, 1 / 0.9), (72, 1.25), (10_000, 10.0)])
def test_degradation_lengthens_steps_with_uptime(uptime_h: float, factor: float) -> None:
    timer = StepTimer(make_config().step_model, degradation_per_72h=0.2)
    assert timer.ageing_factor(uptime_h * 3600) == pytest.approx(factor)


def _decode_tokens_per_s(batch: int, gpu: str = "a100-80gb") -> float:
    """Engine output tok/s over full-batch decode steps (768-token prompts, 512 outputs: ~1k context)."""
    sched = make_scheduler(gpu_profile=gpu)
    for _ in range(batch):
        sched.add(make_request(768, max_tokens=512), 0.0)
    tokens, seconds = 0, 0.0
    _, results = run_until_idle(sched)
    for r in results:
        if r.plan.work.prefill_attention_tokens2 == 0 and len(r.plan.scheduled) == batch:
            tokens += len(r.events)
            seconds += r.plan.duration
    return tokens / seconds


@pytest.mark.parametrize(("batch", "target"), [(1, 85.0), (32, 2500.0), (256, 8000.0)])
def test_a100_decode_throughput_matches_calibration(batch: int, target: float) -> None:
    assert _decode_tokens_per_s(batch) == pytest.approx(target, rel=0.10)


def test_a100_idle_512_token_prefill_matches_calibration() -> None:
    sched = make_scheduler()
    req = make_request(512, max_tokens=1)
    sched.add(req, 0.0)
    run_until_idle(sched)
    assert req.first_token_time == pytest.approx(0.040, rel=0.10)


def test_faster_gpus_decode_faster() -> None:
    a100, h100, h200 = (_decode_tokens_per_s(8, g) for g in ("a100-80gb", "h100-80gb", "h200-141gb"))
    assert a100 < h100 < h200
    assert StepTimeModel.for_names(make_config().facts, "cpu-demo").step_seconds(1) > 0.1
