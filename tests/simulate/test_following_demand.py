"""The default scaler, replayed through the simulator, follows a sustained step of demand within a cold start
and does not chase a burst shorter than one."""

from __future__ import annotations

from pathlib import Path

from fleet.capacity.paid_floor import paid_floor
from fleet.protocol.wire import RATE_WINDOW_S
from simulate.configs import stack_config
from simulate.replay import BOUND_INTERVAL_S, Prepared, _spec, prepare, run_config
from simulate.result import Result
from simulate.trace import TraceRequest, synthetic_trace
from tests.support.stacks import write_stack


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


def _burst() -> list[TraceRequest]:
    """20 req/s with a 16x burst for ten seconds at t=300 s."""
    base = 20.0
    return synthetic_trace(16 * base, 1, 480.0, lambda t: 1.0 if 300 <= t < 310 else 1 / 16)


def test_a_ten_second_burst_is_not_chased(tmp_path: Path) -> None:
    # prod (cold start 150 s): what its three replicas cannot take of the burst at once waits in the batches and
    # the gateway queue, and a replica launched for it would serve two minutes after the burst had passed. This is
    # about the scaler's own following of demand, so the paid floor (which holds prod at 24) is off here.
    stack = write_stack(tmp_path / "Pulumi.prod.yaml", "prod", **{"pools.0.replicas.fillPaidNodes": False})
    prepared, result = replay(str(stack), _burst())
    assert prepared.initial_replicas == prepared.pool.replicas.min == 3
    grown = [(t, billed) for t, billed, _, _ in result.timeline if billed > prepared.initial_replicas]
    assert not grown, f"the burst was chased: {grown[:3]}"
    assert result.completed == len(prepared.trace)


def test_prod_holds_its_paid_floor_through_quiet_and_burst() -> None:
    # The same traffic on prod as shipped (fillPaidNodes on): the 24 A100s its three minimum nodes pay for serve
    # from the start and the pool never drops below them, burst or no burst.
    prepared, result = replay("prod", _burst())
    spec = _spec("prod")
    floor = paid_floor(spec, spec.pools[0])
    assert floor is not None and (floor.replicas, floor.paid_gpus) == (24, 24)
    assert prepared.paid_floor == 24
    assert result.timeline and min(billed for _, billed, _, _ in result.timeline) >= floor.replicas
    assert result.completed == len(prepared.trace)
