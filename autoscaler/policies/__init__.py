"""Scaling policies: pure functions of a ScalingContext, registered by name.

Every policy has one verb, ``propose(ctx) -> Proposal``: a desired replica count (a float: the guard-rails round
it) plus the state it wants back next tick and the reason. Policies never clamp to min/max, never apply
stabilisation windows and never look at the clock except through ``ctx.now``: `autoscaler.guardrails` does that
once for all of them.

    class MyPolicy(ScalingPolicy, name="my-policy"):
        def propose(self, ctx: ScalingContext) -> Proposal: ...
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autoscaler.context import ScalingContext

__all__ = ["REGISTRY", "Proposal", "ScalingPolicy", "make_policy"]

REGISTRY: dict[str, type[ScalingPolicy]] = {}


@dataclass(frozen=True)
class Proposal:
    """A policy's answer: ``desired`` replicas of capacity, why, and the state to carry to the next tick."""

    desired: float
    reason: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)


class ScalingPolicy(abc.ABC):
    """Base class: subclasses register themselves with ``class X(ScalingPolicy, name="x")``."""

    name: ClassVar[str]

    def __init_subclass__(cls, *, name: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = name
        REGISTRY[name] = cls

    @abc.abstractmethod
    def propose(self, ctx: ScalingContext) -> Proposal:
        """The desired capacity for ``ctx``; pure: no I/O, no clock but ``ctx.now``."""


def make_policy(name: str) -> ScalingPolicy:
    """An instance of the policy registered as ``name``; ValueError lists the registered names."""
    try:
        return REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown scaling policy {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None


# Register the shipped policies (imported for their side effect on REGISTRY).
from autoscaler.policies import target_tracking, threshold  # noqa: E402

del target_tracking, threshold
