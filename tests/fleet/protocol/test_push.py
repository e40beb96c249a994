"""Push cadence: the interval while pushes succeed, doubling waits while they fail, capped, reset on success."""

from __future__ import annotations

import asyncio

import pytest

from fleet.protocol.push import Backoff, push_loop


@pytest.mark.parametrize(
    ("interval_s", "max_s", "outcomes", "last_delays"),
    [
        pytest.param(1.0, 10.0, [True, True], [1.0, 1.0], id="success-keeps-the-interval"),
        pytest.param(1.0, 10.0, [False, False, False, False], [1.0, 2.0, 4.0, 8.0], id="first-retry-at-the-interval"),
        pytest.param(0.5, 3.0, [False] * 5, [0.5, 1.0, 2.0, 3.0, 3.0], id="capped-at-max"),
        pytest.param(1.0, 10.0, [False, False, False, True], [1.0, 2.0, 4.0, 1.0], id="one-success-resets"),
        pytest.param(1.0, 30.0, [False] * 2000, [30.0, 30.0], id="long-outage-stays-capped"),
    ],
)
def test_delay_after_each_outcome(
    interval_s: float, max_s: float, outcomes: list[bool], last_delays: list[float]
) -> None:
    backoff = Backoff(interval_s, max_s)
    delays = []
    for ok in outcomes:
        backoff.record(ok)
        delays.append(backoff.delay())
    assert delays[-len(last_delays) :] == last_delays


@pytest.mark.parametrize(
    ("failures", "draw", "expected"),
    [
        pytest.param(0, 0.0, 0.8, id="low-end"),
        pytest.param(0, 0.5, 1.0, id="middle"),
        pytest.param(2, 0.75, 2.2, id="spreads-the-backoff-too"),
    ],
)
def test_jitter_scales_the_wait_within_the_fraction(failures: int, draw: float, expected: float) -> None:
    backoff = Backoff(1.0, 10.0, jitter=0.2, rand=lambda: draw, failures=failures)
    assert backoff.delay() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("outcomes", "before"),
    [
        pytest.param([True], [0], id="healthy"),
        pytest.param([False, False, True], [0, 1, 2], id="outage-then-recovery"),
    ],
)
def test_record_returns_the_failures_before(outcomes: list[bool], before: list[int]) -> None:
    backoff = Backoff(1.0, 10.0)
    assert [backoff.record(ok) for ok in outcomes] == before


class FakeClock:
    """Records the waits asked for; each returns at once (or never, with ``hang``)."""

    def __init__(self, hang: bool = False) -> None:
        self.waits: list[float] = []
        self.hang = hang

    def monotonic(self) -> float:
        return 0.0

    def time(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.hang:
            await asyncio.Event().wait()
        await asyncio.sleep(0)


async def test_loop_waits_the_backoff_between_pushes() -> None:
    backoff = Backoff(1.0, 4.0)
    outcomes = iter([False, False, False, True])
    clock = FakeClock()
    done = asyncio.Event()

    async def push() -> None:
        ok = next(outcomes, None)
        if ok is None:
            done.set()
            await asyncio.Event().wait()
        else:
            backoff.record(ok)

    task = asyncio.create_task(push_loop(push, backoff, clock))
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.waits == [1.0, 2.0, 4.0, 1.0]


async def test_wake_cuts_the_wait_short() -> None:
    backoff = Backoff(60.0, 60.0)
    wake = asyncio.Event()
    pushes = 0

    async def push() -> None:
        nonlocal pushes
        pushes += 1

    task = asyncio.create_task(push_loop(push, backoff, FakeClock(hang=True), wake=wake))
    async with asyncio.timeout(5):
        for woken in range(3):
            while pushes <= woken:
                await asyncio.sleep(0)
            wake.set()
        while pushes < 4:
            await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not wake.is_set()  # each wake is consumed by the wait it cut short
