"""Clients spec: who calls the fleet (tenants: key hashes, quotas, models) and the names they call (aliases).

Part of `fleet.spec.stack` (every model is importable from there). An alias spreads one model name over several
pools by weight and carries the canary rollout settings of that name.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from fleet.spec.base import KEY_HASH, Name, Spec

__all__ = ["AliasName", "AliasSpec", "RolloutSpec", "TenantSpec"]


class TenantSpec(Spec):
    name: Name
    """Tenant name."""
    api_key_hashes: list[str] = Field(default_factory=list)
    """"sha256:<hex>' of each key."""
    api_keys_secret: str | None = None
    """Pulumi secret config key holding a list of keys."""
    priority: int = Field(default=1, ge=0, le=9)
    """Higher is served first."""
    requests_per_second: float = Field(default=10.0, gt=0, le=1_000_000)
    """Request rate quota."""
    tokens_per_minute: int = Field(default=200_000, gt=0)
    """Token quota (prompt + max_tokens reserved at admission, reconciled after)."""
    max_concurrency: int = Field(default=32, ge=1, le=1_000_000)
    """Requests in flight at once."""
    allowed_models: list[str] = Field(default_factory=lambda: ["*"])
    """Served model names the tenant may use, or `*`."""
    cache_group: Name | None = None
    """Tenants that trust each other: those naming one group share one engine prefix cache (default: its own)."""

    @field_validator("api_key_hashes")
    @classmethod
    def _hash_shape(cls, value: list[str]) -> list[str]:
        for item in value:
            if not KEY_HASH.match(item):
                shown = item[:12] + "..." if len(item) > 12 else item
                raise ValueError(
                    f"{shown!r} is not a key hash; use 'sha256:<64 hex digits>' "
                    "(`llmfleet hash-key` prints one); plain keys never go in a stack file"
                )
        return value


# A name clients send as `model`: what OpenAI model ids and served model names look like.
_ALIAS_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
AliasName = Annotated[str, Field(pattern=_ALIAS_NAME)]
Weight = Annotated[int, Field(ge=0, strict=True)]


RolloutMetric = Literal["ttftP99", "tpotP99", "errorRate"]
ROLLOUT_METRICS: tuple[RolloutMetric, ...] = ("ttftP99", "tpotP99", "errorRate")


class RolloutSpec(Spec):
    """How a canary rollout of the alias runs (``llmfleet rollout start``), e.g. ``{steps: [1, 5, 25, 50, 100],
    bakeS: 300, minSamples: 100}``."""

    steps: list[int] = Field(default_factory=lambda: [1, 5, 25, 50, 100], min_length=2, max_length=20)
    """The candidate's percent of the alias, step by step: increasing, ending at 100 (reaching it promotes)."""
    bake_s: float = Field(default=300.0, gt=0, le=86_400)
    """Seconds each step is observed before the next; its window is judged against the baseline's."""
    min_samples: int = Field(default=100, ge=1, le=10_000_000)
    """Requests each side must have answered in a step's window before it is judged (no step up without them)."""
    tolerance: float = Field(default=0.10, ge=0.0, lt=1.0)
    """How much worse than the baseline the candidate's judged metrics may be (0.10: 10%)."""
    metrics: list[RolloutMetric] = Field(default_factory=lambda: list(ROLLOUT_METRICS), min_length=1)
    """What a step is judged on: any of TTFT p99, TPOT p99 and the error rate (a p99 over a small window is
    mostly its slowest request: judge latency only where minSamples is in the hundreds)."""
    baseline: str | None = None
    """The pool rolled away from (default: the alias's pool of highest weight other than the candidate)."""
    baseline_after: Literal["zero", "min"] = "zero"
    """After a promotion the baseline (at weight 0) drains down to no replica (zero) or to its replicas.min."""

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[int]) -> list[int]:
        if any(not 1 <= s <= 100 for s in steps) or steps[-1] != 100:
            raise ValueError(f"percents from 1 to 100, ending at 100; got {steps}")
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError(f"each step above the one before; got {steps}")
        return steps


class AliasSpec(Spec):
    """A model name served by several pools by weight, e.g. ``chat: {pools: {qwen-v1: 95, qwen-v2: 5}}``."""

    pools: dict[str, Weight] = Field(min_length=1)
    """Pool name -> weight (a non-negative integer): each pool's share of the alias's sessions is weight / sum."""
    fallback: str | None = None
    """A pool outside `pools` that takes the requests whose chosen pool has no ready replica."""
    sticky: Literal["session", "none"] = "session"
    """session: a conversation (session header, else its leading prompt blocks) keeps its pool; none: per request."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Canary rollouts of this alias: steps, bake time, samples, tolerance."""

    @model_validator(mode="after")
    def _rollout_baseline_is_a_pool(self) -> AliasSpec:
        baseline = self.rollout.baseline
        if baseline is not None and baseline not in self.pools:
            raise ValueError(f"rollout.baseline {baseline!r} is not one of the alias's pools ({', '.join(self.pools)})")
        return self
