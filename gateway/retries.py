"""Retries: the budget that keeps retries from snowballing when a pool is failing.

Every request deposits ``fraction`` of a token, every retry withdraws one, and the balance is capped at
``reserve`` (and starts there). So at steady state retries add at most ``fraction`` of the traffic, and a
sudden failure of everything costs at most ``reserve`` extra attempts before the ratio applies.

Resumed streams (`gateway.streams`) draw on the same budget, except for each stream's first resume: one engine
death breaks every stream on it at once (up to its ``maxNumSeqs``), far beyond any reserve, and continuing each
of them once repeats only its prompt's prefill. That cannot snowball: a stream gets one free resume, and every
further one (a second failure, a replica that refused the resume) is a retry like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RetryBudget"]


@dataclass
class RetryBudget:
    fraction: float
    reserve: float = 10.0
    balance: float = -1.0

    def __post_init__(self) -> None:
        if self.balance < 0:
            self.balance = self.reserve

    def on_request(self) -> None:
        self.balance = min(self.reserve, self.balance + self.fraction)

    def try_spend(self) -> bool:
        if self.balance >= 1.0:
            self.balance -= 1.0
            return True
        return False

    def try_resume(self, resumed_before: int) -> bool:
        """Whether a stream that already made ``resumed_before`` resume attempts may make one more."""
        return resumed_before == 0 or self.try_spend()
