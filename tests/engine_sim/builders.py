"""Builders for the engine-simulator tests."""

from __future__ import annotations

import itertools
from typing import Any

from engine_sim.config import EngineConfig, build_scheduler
from engine_sim.request import SimRequest
from engine_sim.scheduler import Scheduler, StepResult
from fleet.capacity.catalog import MODELS

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
_ids = itertools.count()


def make_config(**overrides: Any) -> EngineConfig:
    fields: dict[str, Any] = {"model": QWEN_7B, "facts": MODELS[QWEN_7B], "served_model_name": "qwen"}
    fields.update(overrides)
    return EngineConfig(**fields)


def make_scheduler(**overrides: Any) -> Scheduler:
    return build_scheduler(make_config(**overrides))


def unique_prompt(n: int) -> list[int]:
    """``n`` token ids no other prompt shares (no accidental prefix hits)."""
    base = next(_ids) * 1_000_000
    return list(range(base, base + n))


def make_request(prompt: list[int] | int, max_tokens: int = 16, **kw: Any) -> SimRequest:
    ids = unique_prompt(prompt) if isinstance(prompt, int) else prompt
    return SimRequest(f"req-{next(_ids)}", ids, max_tokens, **kw)


def run_until_idle(sched: Scheduler, now: float = 0.0, max_steps: int = 1_000_000) -> tuple[float, list[StepResult]]:
    """Step in virtual time until no work is left; returns the end time and every step's result."""
    results: list[StepResult] = []
    for _ in range(max_steps):
        result = sched.step(now)
        if result is None:
            return now, results
        now = result.plan.end
        results.append(result)
    raise AssertionError("scheduler did not drain")
