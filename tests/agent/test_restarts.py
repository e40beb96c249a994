"""Crash restarts: exponential backoff with bounded jitter, crash-loop detection over a sliding window."""

from __future__ import annotations

import pytest

from agent.restarts import CrashHistory, RestartPolicy

POLICY = RestartPolicy(max_restarts=3, window_s=60.0, backoff_base_s=1.0, backoff_max_s=5.0, jitter=0.2)


def history_with(*times: float) -> CrashHistory:
    history = CrashHistory(POLICY)
    for t in times:
        history.record(t)
    return history


@pytest.mark.parametrize(
    ("failures", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (10, 5.0)], ids=lambda v: str(v)
)
def test_backoff_doubles_per_recent_failure_up_to_the_cap(failures: int, expected: float) -> None:
    history = history_with(*[float(i) for i in range(failures)])
    assert history.backoff_s(10.0, rand=0.5) == pytest.approx(expected)


@pytest.mark.parametrize("rand", [0.0, 0.25, 0.999])
def test_jitter_stays_within_its_fraction(rand: float) -> None:
    delay = history_with(0.0, 1.0).backoff_s(2.0, rand)
    assert 2.0 * 0.8 <= delay <= 2.0 * 1.2


def test_failures_age_out_of_the_window() -> None:
    history = history_with(0.0, 10.0, 20.0, 30.0)
    assert history.crash_looping(30.0)
    assert not history.crash_looping(60.5)  # the failure at 0 left the window
    assert history.recent(95.0) == 0
    assert history.backoff_s(95.0, 0.5) == pytest.approx(1.0)


def test_crash_loop_after_more_than_max_restarts_and_cooldown_until_one_ages_out() -> None:
    history = history_with(0.0, 10.0, 20.0)
    assert not history.crash_looping(20.0)
    history.record(30.0)
    assert history.crash_looping(30.0)
    assert history.cooldown_until(30.0) == pytest.approx(60.0)
    history.record(31.0)
    assert history.cooldown_until(31.0) == pytest.approx(70.0)


def test_clear_forgets_everything() -> None:
    history = history_with(0.0, 1.0, 2.0, 3.0)
    history.clear()
    assert not history.crash_looping(3.0) and history.recent(3.0) == 0


def test_invalid_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        RestartPolicy(jitter=1.5)
