"""The default scaler, replayed through the simulator, follows a sustained step of demand within a cold start
and does not chase a burst shorter than one."""

from __future__ import annotations

from fleet.protocol.wire import RATE_WINDOW_S
from simulate.configs import stack_config
from simulate.replay import BOUND_INTERVAL_S, Prepared, _spec, prepare, run_config
from simulate.result import Result
from simulate.trace import TraceRequest, synthetic_trace


def replay(stack: str, trace: list[TraceRequest]) -> tuple[Prepared, Result]:
    prepared = prepare(stack, trace)
    return prepared, run_config(prepared, stack_config(_spec(stack)), seed=0)


def test_a_sustained_step_is_ordered_within_a_cold_start() -> None:
    # `make up`'s stack, README's load: 3 req/s, then 30 req/s from t=60 s on; the plan needs two replicas.
    step_at = 60.0
    prepared, result = replay("local", synthetic_trace(30.0, 1, 200.0, lambda t: 0.1 if t < step_at else 1.0))
    need = max(prepared.needed[int(step_at // BOUND_INTERVAL_S) :])
    assert need >= 2
    cold = prepared.pool.cold_start_seconds
    assert cold > RATE_WINDOW_S  # the step reaches the scaler spread over the gateways' window, within a cold start
    ordered = next(t for t, billed, _, _ in result.timeline if t > step_at and billed >= need)
    assert ordered - step_at <= cold, f"{need} replicas ordered {ordered - step_at:.0f}s after the step"
    assert result.rejected == 0


def test_a_ten_second_burst_is_not_chased() -> None:
    # prod (cold start 150 s): 20 req/s with a 16x burst for ten seconds at t=300 s; what its three replicas
    # cannot take at once waits in the batches and the gateway queue, and a replica launched for it would serve
    # two minutes after the burst had passed.
    base = 20.0
    burst = synthetic_trace(16 * base, 1, 480.0, lambda t: 1.0 if 300 <= t < 310 else 1 / 16)
    prepared, result = replay("prod", burst)
    assert prepared.initial_replicas == prepared.pool.replicas.min == 3
    grown = [(t, billed) for t, billed, _, _ in result.timeline if billed > prepared.initial_replicas]
    assert not grown, f"the burst was chased: {grown[:3]}"
    assert result.completed == len(prepared.trace)
