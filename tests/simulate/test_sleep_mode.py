"""Sleep mode replayed through the simulator: a scale-down puts drained replicas to sleep, still billed, and the
next ramp of demand wakes them (a wake, not a cold start), so the ramp is served within the SLO."""

from __future__ import annotations

from pathlib import Path

from simulate.configs import stack_config
from simulate.replay import Prepared, _spec, prepare, run_config
from simulate.report import row
from simulate.result import Result
from simulate.trace import TraceRequest, synthetic_trace
from tests.support.stacks import write_stack

RAMP_AT = 200.0  # demand comes back here after 140 s at a tenth
COLD_START_S = 150.0  # an A100 replica's, not `make up`'s 15 s: what a wake saves is visible


def _trace() -> list[TraceRequest]:
    """80 req/s for 60 s, a tenth of it until RAMP_AT (the pool scales in to one), then 80 req/s for 120 s."""
    return synthetic_trace(80.0, 1, 320.0, lambda t: 1.0 if t < 60 or t >= RAMP_AT else 0.1)


def _replay(tmp_path: Path, sleep_mode: bool) -> tuple[Prepared, Result]:
    # `make up`'s stack; the policy releases at once (no envelope), so the quiet spell scales the pool in.
    overrides = {
        "pools.0.engine.sleepMode": sleep_mode,
        "pools.0.coldStartSeconds": COLD_START_S,
        "autoscaling.policy": {"name": "target-tracking", "params": {"releaseTimeConstantS": 0}},
    }
    stack = str(write_stack(tmp_path / f"Pulumi.sleep-{sleep_mode}.yaml", "local", **overrides))
    prepared = prepare(stack, _trace())
    return prepared, run_config(prepared, stack_config(_spec(stack)), seed=0)


def _p99s(result: Result, start: float, end: float) -> list[float]:
    """Each control tick's TTFT p99 from ``start`` to ``end``."""
    return [p99 for t, _, _, p99 in result.timeline if start <= t < end]


def test_the_ramp_after_a_scale_in_wakes_sleeping_replicas_and_stays_within_the_slo(tmp_path: Path) -> None:
    prepared, cold = _replay(tmp_path, sleep_mode=False)
    _, warm = _replay(tmp_path, sleep_mode=True)
    slo = prepared.pool.slo.ttft_p99_ms / 1000.0
    assert cold.wakes == 0 and warm.wakes >= 1
    # The ramp reaches the scaler within a few ticks. Without sleep mode its replicas arrive a cold start later,
    # and until then every tick's p99 is over the SLO and the queue overflows; woken replicas serve it within the
    # SLO from then on.
    settled = RAMP_AT + 10
    assert min(_p99s(cold, settled, RAMP_AT + COLD_START_S)) > slo
    assert max(_p99s(warm, settled, float("inf"))) <= slo, _p99s(warm, RAMP_AT, settled + 20)
    assert cold.rejected > 0 and warm.rejected == 0
    assert row(warm, prepared)["within_slo_feasible"] > row(cold, prepared)["within_slo_feasible"]
    # Sleeping replicas hold their GPUs: billed through the quiet spell, where stopped ones are not.
    quiet = [(w, c) for (t, w, _, _), (_, c, _, _) in zip(warm.timeline, cold.timeline, strict=False) if 170 <= t < 200]
    assert quiet and all(w > c == 1 for w, c in quiet), quiet
    assert warm.completed == len(prepared.trace)
