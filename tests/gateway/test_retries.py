"""RetryBudget: retries add at most ``fraction`` of the traffic once the reserve is spent."""

from __future__ import annotations

import pytest

from gateway.retries import RetryBudget


def test_a_fresh_budget_allows_its_reserve_then_refuses() -> None:
    budget = RetryBudget(fraction=0.2, reserve=3)
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]


def test_requests_refill_the_budget_up_to_the_reserve_only() -> None:
    budget = RetryBudget(fraction=0.5, reserve=2)
    for _ in range(100):
        budget.on_request()
    assert budget.balance == 2  # capped: quiet hours do not bank retries for a storm
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5])
def test_when_everything_fails_retries_stay_within_the_fraction_plus_the_reserve(fraction: float) -> None:
    budget, reserve, requests = RetryBudget(fraction=fraction, reserve=10), 10, 10_000
    retries = 0
    for _ in range(requests):
        budget.on_request()
        while budget.try_spend():  # every attempt fails, and each request retries while it may
            retries += 1
    assert retries <= fraction * requests + reserve
    assert retries >= fraction * requests - 1  # and the budget is not stingier than promised


def test_each_stream_has_one_free_resume_and_further_ones_spend_the_budget() -> None:
    budget = RetryBudget(fraction=0.2, reserve=1)
    # An engine death breaks a hundred streams at once: each may resume once, whatever the balance.
    assert all(budget.try_resume(resumed_before=0) for _ in range(100)) and budget.balance == 1
    assert [budget.try_resume(resumed_before=1) for _ in range(2)] == [True, False]
