"""Restarts: why an engine restarts, crash-restart backoff and crash-loop detection over a sliding window (pure,
``now`` passed in).

Failures (engine exit, liveness failure, startup timeout) are recorded with their time. The k-th failure
inside the window waits ``min(max, base * 2**(k-1))`` seconds, spread by +/- ``jitter`` so replicas that
crashed together do not restart in lockstep. Once more than ``maxRestarts`` failures fall inside the window
the replica is crash-looping: it stops restarting until an operator resets it or the oldest failure ages out.
Planned (restart-window) restarts are not failures and are never recorded here.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

__all__ = ["CrashHistory", "RestartPolicy", "RestartReason"]


class RestartReason(enum.StrEnum):
    """Why the supervisor restarts the engine; the value is the ``reason`` label of
    ``llmfleet_agent_engine_restarts_total``. Only ``planned`` skips the crash backoff."""

    CRASH = "crash"  # before any failure is recorded
    SPAWN_FAILED = "spawn_failed"
    ENGINE_EXITED = "engine_exited"
    STARTUP_TIMEOUT = "startup_timeout"
    LIVENESS_FAILED = "liveness_failed"
    FETCH_FAILED = "fetch_failed"
    PLANNED = "planned"  # restart window, lease held
    RESET = "reset"  # operator reset of a failed replica
    COOLDOWN = "cooldown"  # the crash window let a failed replica through
    SLEEP_FAILED = "sleep_failed"  # sleep mode: the check before the sleep, or POST /sleep, failed
    WAKE_FAILED = "wake_failed"  # sleep mode: POST /wake_up, or the check after it, failed
    WAKE_MISMATCH = "wake_mismatch"  # sleep mode: the check after the wake gave other tokens than before the sleep


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5  # restarts allowed inside the window; one more failure -> failed
    window_s: float = 600.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    jitter: float = 0.2  # fraction, uniform +/-

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window_s <= 0 or self.backoff_base_s < 0 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid restart policy: {self}")


class CrashHistory:
    """Failure times inside the policy's window."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: deque[float] = deque()

    def _prune(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.policy.window_s:
            self._times.popleft()

    def record(self, now: float) -> None:
        self._times.append(now)
        self._prune(now)

    def recent(self, now: float) -> int:
        self._prune(now)
        return len(self._times)

    def crash_looping(self, now: float) -> bool:
        return self.recent(now) > self.policy.max_restarts

    def cooldown_until(self, now: float) -> float:
        """When enough failures will have aged out for a restart to be allowed again."""
        self._prune(now)
        excess = len(self._times) - self.policy.max_restarts
        if excess <= 0:
            return now
        return self._times[excess - 1] + self.policy.window_s

    def backoff_s(self, now: float, rand: float) -> float:
        """Delay before the next restart; ``rand`` is uniform in [0, 1) (injected for tests)."""
        k = max(1, self.recent(now))
        delay = min(self.policy.backoff_max_s, self.policy.backoff_base_s * 2.0 ** (k - 1))
        return max(0.0, delay * (1.0 + self.policy.jitter * (2.0 * rand - 1.0)))

    def clear(self) -> None:
        self._times.clear()
