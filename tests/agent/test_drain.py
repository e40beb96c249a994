"""Stopping one engine: which bound ends the wait for a SIGTERMed engine, and when, under a virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from agent.drain import Stop, StopBounds, stop_engine
from tests.agent.builders import FakeEngine, VirtualClock

IDLE_S, STARTING_S, DEADLINE_S = 20.0, 5.0, 100.0


@dataclass
class ScriptedMetrics:
    """An engine's /metrics: ``in_flight(t)`` requests at ``t`` seconds after the SIGTERM; None: the scrape fails."""

    clock: VirtualClock
    in_flight: Callable[[float], float | None]
    t0: float = field(init=False)

    def __post_init__(self) -> None:
        self.t0 = self.clock.now

    async def metrics(self) -> str:
        value = self.in_flight(self.clock.now - self.t0)
        if value is None:
            raise ConnectionError("refused")
        return (
            f"vllm:num_requests_running {value}\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"
            "vllm:num_preemptions_total 0\nvllm:prompt_tokens_total 0\nvllm:generation_tokens_total 0\n"
        )


def _never_exits() -> FakeEngine:
    return FakeEngine(100, ignores_sigterm=True)


CASES = [
    # name, engine never ready?, in flight(t), deadline after SIGTERM, expected stop, seconds after SIGTERM
    ("busy until the deadline", False, lambda t: 3.0, DEADLINE_S, Stop.DEADLINE, DEADLINE_S),
    ("idle from the start", False, lambda t: 0.0, DEADLINE_S, Stop.IDLE_GRACE, IDLE_S),
    ("idle once its requests finished", False, lambda t: 2.0 if t < 30 else 0.0, DEADLINE_S, Stop.IDLE_GRACE, 50.0),
    (
        "idle, then its HTTP server closes: still idle",
        False,
        lambda t: 0.0 if t < 8 else None,
        DEADLINE_S,
        Stop.IDLE_GRACE,
        IDLE_S,
    ),
    ("never answers /metrics", False, lambda t: None, DEADLINE_S, Stop.DEADLINE, DEADLINE_S),
    ("idle grace past the deadline", False, lambda t: 0.0, 12.0, Stop.DEADLINE, 12.0),
    ("starting: ignores SIGTERM", True, lambda t: None, DEADLINE_S, Stop.STARTING_GRACE, STARTING_S),
    ("starting, warm and idle: the shorter grace", True, lambda t: 0.0, DEADLINE_S, Stop.STARTING_GRACE, STARTING_S),
    ("starting grace past the deadline", True, lambda t: None, 3.0, Stop.DEADLINE, 3.0),
]


@pytest.mark.parametrize(
    ("starting", "in_flight", "deadline_s", "expected", "after_s"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
async def test_an_engine_that_ignores_sigterm_is_killed_at_the_first_bound(
    starting: bool, in_flight: Callable[[float], float | None], deadline_s: float, expected: Stop, after_s: float
) -> None:
    clock, engine = VirtualClock(), _never_exits()
    bounds = StopBounds(clock.now + deadline_s, IDLE_S, STARTING_S if starting else None, poll_s=0.25)
    stop = await stop_engine(
        engine, ScriptedMetrics(clock, in_flight), clock, clock.sleep, propagation_s=None, bounds=bounds
    )
    assert stop is expected and engine.killed
    assert clock.now - (bounds.deadline - deadline_s) == pytest.approx(after_s, abs=0.3)


@pytest.mark.parametrize("starting", [False, True], ids=["was ready", "never ready"])
async def test_an_engine_that_exits_on_sigterm_is_reaped_without_waiting(starting: bool) -> None:
    clock, engine = VirtualClock(), FakeEngine(100)
    bounds = StopBounds(clock.now + DEADLINE_S, IDLE_S, STARTING_S if starting else None)
    t0 = clock.now
    metrics = ScriptedMetrics(clock, lambda t: 0.0)
    stop = await stop_engine(engine, metrics, clock, clock.sleep, propagation_s=None, bounds=bounds)
    assert stop is Stop.EXITED and engine.returncode == 0 and clock.now == t0


async def test_a_ready_engine_serves_on_through_the_propagation_delay_before_its_sigterm() -> None:
    clock, engine = VirtualClock(), FakeEngine(100)
    t0 = clock.now
    bounds = StopBounds(clock.now + DEADLINE_S, IDLE_S)
    metrics = ScriptedMetrics(clock, lambda t: 0.0)
    await stop_engine(engine, metrics, clock, clock.sleep, propagation_s=10.0, bounds=bounds)
    assert clock.now - t0 == 10.0 and engine.returncode == 0
