"""Faults: injected failures for reliability tests, decided by a seeded, clock-free policy object.

| flag                                   | effect                                                                |
|----------------------------------------|-----------------------------------------------------------------------|
| ``--fault-crash-after-requests N``     | the (N+1)th generation request kills the engine: in-flight requests   |
|                                        | fail (500 / in-band error), ``/health`` is 503, the process exits     |
| ``--fault-crash-at-seconds S``         | the same, S wall seconds after the port opened                        |
| ``--fault-hang``                       | every HTTP request is accepted and never answered                     |
| ``--fault-slowdown X``                 | every engine step takes X times longer                                |
| ``--fault-error-rate F``               | a fraction F of generation requests fail at once with                 |
| ``--fault-error-status CODE``          | status CODE (default 500) in OpenAI's error JSON                      |
| ``--fault-die-mid-stream-after-tokens N`` | the process exits abruptly (connections reset, no ``[DONE]``) once |
|                                        | any request has produced N tokens                                     |
| ``--fault-wake-changes-tokens``        | (sleep mode) every wake brings back other weights: a greedy request   |
|                                        | gives other tokens than it gave before the sleep (`engine_sim.sleep`)  |

Crash: the engine dies the way vLLM's EngineCore does (503 health, then exit after ``exit_delay_s``).
Die: the whole process vanishes at once, like an OOM kill.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine_sim.errors import RequestError

__all__ = ["FaultAction", "FaultPolicy", "FaultSpec"]


@dataclass(frozen=True)
class FaultSpec:
    crash_after_requests: int | None = None
    crash_at_seconds: float | None = None
    hang: bool = False
    slowdown: float = 1.0
    error_rate: float = 0.0
    error_status: int = 500
    die_mid_stream_after_tokens: int | None = None
    wake_changes_tokens: bool = False
    exit_delay_s: float = 0.5

    @property
    def any(self) -> bool:
        return self != FaultSpec(exit_delay_s=self.exit_delay_s)


@dataclass(frozen=True)
class FaultAction:
    """What to do with one arriving request: crash the engine, fail it with ``error``, or proceed (both None)."""

    crash: bool = False
    error: RequestError | None = None


class FaultPolicy:
    """Counts requests and tokens against a `FaultSpec`; the server carries out the actions it returns."""

    def __init__(self, spec: FaultSpec, seed: int = 0) -> None:
        self.spec = spec
        self._rng = random.Random(seed)
        self.requests = 0

    def on_request(self) -> FaultAction:
        self.requests += 1
        limit = self.spec.crash_after_requests
        if limit is not None and self.requests > limit:
            return FaultAction(crash=True)
        if self.spec.error_rate > 0 and self._rng.random() < self.spec.error_rate:
            status = self.spec.error_status
            return FaultAction(error=RequestError(status, f"Injected fault: request failed with status {status}."))
        return FaultAction()

    def should_die(self, output_tokens: int) -> bool:
        limit = self.spec.die_mid_stream_after_tokens
        return limit is not None and output_tokens >= limit
