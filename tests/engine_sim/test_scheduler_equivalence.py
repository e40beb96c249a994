"""The optimised scheduler step takes exactly the steps of the plain per-request, per-token one.

`Scheduler` skips the KV calls for steps inside a request's last block, sums the step's work while it picks
requests, reads generated ids a chunk at a time and builds its timer's constants once; `ReferenceScheduler`
(the plain rule) and `StepTimeModel.step_seconds` are the oracles. Random workloads mix shared prompt heads
(prefix hits, identical prompts), answers sent back as the next prompt (hits on generated blocks), chunked
prefills, a KV cache small enough to preempt, aborts while a step runs and every finish reason.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings, strategies as st

from engine_sim.config import build_scheduler
from engine_sim.request import SimRequest
from engine_sim.scheduler import Scheduler, StepPlan, StepResult
from engine_sim.timing import StepTimer, StepWork
from engine_sim.tokenizer import filler_ids
from fleet.capacity.catalog import GPUS, MODELS
from fleet.capacity.perf import StepTimeModel
from tests.engine_sim.builders import make_config
from tests.engine_sim.reference_scheduler import ReferenceScheduler


def _plan_log(plan: StepPlan) -> tuple[Any, ...]:
    return (
        plan.start,
        plan.duration,
        [(r.request_id, n) for r, n in plan.scheduled],
        plan.work,
        [r.request_id for r in plan.preempted],
    )


def _result_log(result: StepResult) -> list[tuple[Any, ...]]:
    return [(e.request.request_id, e.token_id, e.finished, e.first, e.latency) for e in result.events]


def _replay(sched: Scheduler, seed: int) -> list[Any]:
    """Drive ``sched`` with the workload ``seed`` draws; the log of everything it planned and emitted."""
    rng = random.Random(seed)
    heads = [[1_000_000 + h] * rng.choice([15, 16, 40, 300]) for h in range(3)]
    log: list[Any] = []
    finished: list[SimRequest] = []
    now, added = 0.0, 0
    for _ in range(400):
        if added < 40 and rng.random() < 0.3:
            head = rng.choice(heads) if rng.random() < 0.7 else []
            if finished and rng.random() < 0.3:  # a conversation's next turn: the answer is sent back
                head = list(rng.choice(finished).token_ids)[:400]
            tail = [] if head and rng.random() < 0.3 else [2_000_000 + added] * rng.randrange(1, 100)
            request = SimRequest(
                f"r{added}",
                head + tail,
                max_tokens=rng.randrange(1, 80),
                stop_after=rng.choice([None, rng.randrange(1, 40)]),
                output_seed=rng.randrange(3),
            )
            sched.add(request, now)
            added += 1
        plan = sched.schedule(now)
        if plan is None:
            if added >= 40 and not sched.has_work():
                break
            now += 0.01
            continue
        if sched.running and rng.random() < 0.05:  # a client disconnects while the step runs
            victim = rng.choice(sched.running)
            log.append(("abort", victim.request_id))
            sched.abort(victim.request_id, now)
        result = sched.complete(plan)
        finished += [e.request for e in result.events if e.finished is not None]
        log.append((_plan_log(plan), _result_log(result), sched.kv.pool.num_free, sched.kv_usage))
        now = plan.end
    log.append(
        (
            sched.stats,
            sched.num_running,
            sched.num_waiting,
            [(r.request_id, r.num_computed_tokens, r.token_ids) for r in sched.running],
        )
    )
    return log


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    blocks=st.integers(40, 400),
    budget=st.sampled_from([64, 256, 2048]),
    threshold=st.sampled_from([0, 32, 100]),
    max_num_seqs=st.integers(2, 64),
    caching=st.booleans(),
)
def test_the_optimised_step_equals_the_plain_per_request_step(
    seed: int, blocks: int, budget: int, threshold: int, max_num_seqs: int, caching: bool
) -> None:
    config = make_config(
        max_model_len=512,
        num_gpu_blocks_override=blocks,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=caching,
    )
    fast = build_scheduler(config)
    plain = build_scheduler(config)
    reference = ReferenceScheduler(plain.config, plain.kv, plain.timer, plain.started_at)
    assert _replay(fast, seed) == _replay(reference, seed)


def test_the_workload_reaches_preemption_prefix_hits_and_chunking() -> None:
    """The random workloads above exercise the paths that matter (a workload that did not would prove little)."""
    config = make_config(max_model_len=512, num_gpu_blocks_override=60, max_num_batched_tokens=64)
    sched = build_scheduler(config)
    _replay(sched, 1)
    assert sched.stats.preemptions > 0 and sched.stats.prefix_hits > 0


@settings(max_examples=200, deadline=None)
@given(
    model=st.sampled_from(sorted(MODELS)),
    gpu=st.sampled_from(sorted(GPUS)),
    tp=st.sampled_from([1, 2, 4]),
    tokens=st.integers(0, 8192),
    decode_context=st.integers(0, 2_000_000),
    attention=st.floats(0.0, 1e9),
)
def test_the_timer_base_is_bit_identical_to_the_step_time_model(
    model: str, gpu: str, tp: int, tokens: int, decode_context: int, attention: float
) -> None:
    step_model = StepTimeModel.for_names(MODELS[model], gpu, tp)
    timer = StepTimer(step_model)
    work = StepWork(tokens, decode_context, attention)
    expected = step_model.step_seconds(tokens, decode_context, attention)
    assert timer.base_seconds(work) == expected
    assert timer.base_seconds(work) == expected  # the second call reads the per-token-count cache
    assert timer.seconds(work, uptime_s=3600.0) == expected


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 1 << 32), start=st.integers(1, 40_000), steps=st.integers(1, 300), room=st.integers(1, 300))
def test_generated_ids_read_a_chunk_at_a_time_are_filler_ids(seed: int, start: int, steps: int, room: int) -> None:
    request = SimRequest("r", [0] * start, max_tokens=room, output_seed=seed)
    got = [request.filler_token(start + i) for i in range(steps)]
    assert got == filler_ids(seed, start, steps)


def _drive(sched: Scheduler, seed: int, runs: bool) -> tuple[list[Any], list[float], Any]:
    """Arrivals and one-second-style scrapes on an event clock; with ``runs`` the scheduler decodes in runs (cut
    when a request arrives, advanced at each scrape), as `simulate.fleet_sim.FleetSim` drives it. The scrape log,
    every ITL (sorted) and the final stats."""
    rng = random.Random(seed)
    arrivals = sorted((rng.uniform(0.0, 3.0), 0, i) for i in range(30))
    scrapes = [(0.25 * k, 1, 0) for k in range(1, 40)]
    outside = sorted(arrivals + scrapes)
    plan: StepPlan | None = None
    run_end: float | None = None
    log: list[Any] = []
    itls: list[tuple[float, int]] = []

    def kick(now: float) -> None:
        nonlocal plan, run_end
        if plan is None and run_end is None and sched.has_work():
            run_end = sched.start_decode_run(now, 256) if runs else None
            if run_end is None:
                plan = sched.schedule(now)

    k = 0
    while True:
        step_end = plan.end if plan is not None else run_end
        if k < len(outside) and (step_end is None or outside[k][0] <= step_end):
            now, kind, i = outside[k]
            k += 1
            if kind == 0:
                if run_end is not None:
                    run_end = sched.truncate_decode_run(now)
                prompt = [1_000 + i % 4] * 16 + [2_000 + i] * rng.randrange(1, 300)  # some share a block
                sched.add(SimRequest(f"r{i}", prompt, max_tokens=rng.randrange(1, 120)), now)
                kick(now)
            else:
                if run_end is not None:
                    itls += sched.advance_decode_run(now)
                running = [(r.request_id, r.num_computed_tokens, list(r.token_ids)) for r in sched.running]
                log.append((now, sched.stats.generation_tokens, sched.stats.steps, sched.kv.pool.num_free, running))
        elif plan is not None:
            result = sched.complete(plan)
            itls += [(e.latency, 1) for e in result.events if not e.first]
            now, plan = plan.end, None
            kick(now)
        elif run_end is not None:
            itls += sched.finish_decode_run()
            now, run_end = run_end, None
            kick(now)
        else:
            break
    return log, sorted(x for latency, count in itls for x in [latency] * count), sched.stats


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(60, 1000), caching=st.booleans())
def test_decode_runs_leave_the_state_single_steps_leave(seed: int, blocks: int, caching: bool) -> None:
    config = make_config(
        max_model_len=512, num_gpu_blocks_override=blocks, max_num_batched_tokens=256, enable_prefix_caching=caching
    )
    assert _drive(build_scheduler(config), seed, runs=True) == _drive(build_scheduler(config), seed, runs=False)


def test_a_decode_run_stops_before_a_finish_and_refuses_what_is_not_a_decode() -> None:
    sched = build_scheduler(make_config())
    sched.add(SimRequest("a", [1] * 20, max_tokens=10), 0.0)
    assert sched.start_decode_run(0.0, 256) is None  # waiting: a prefill comes next
    now = sched.step(0.0).plan.end  # type: ignore[union-attr]
    sched.add(SimRequest("b", [2] * 20, max_tokens=3), now)
    now = sched.step(now).plan.end  # type: ignore[union-attr]
    # a has 2 of 10 tokens, b 1 of 3: b's last token comes in the second step from now, so one step could run
    assert sched.start_decode_run(now, 256) is None
    now = sched.step(now).plan.end  # type: ignore[union-attr]
    now = sched.step(now).plan.end  # type: ignore[union-attr]  # b finished: a alone, at 4 of 10
    end = sched.start_decode_run(now, 256)
    assert end is not None and sched.in_run
    itls = sched.finish_decode_run()
    assert sum(count for _, count in itls) == 5 and sched.running[0].num_output_tokens == 9  # the 10th: a step
    assert sched.start_decode_run(end, 256) is None
    result = sched.step(end)
    assert result is not None and result.events[0].finished is not None
