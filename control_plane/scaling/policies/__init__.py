"""Scaling policies: pure functions of a ScalingContext, registered by name.

Every policy has one verb, ``propose(ctx) -> Proposal``: a desired replica count (a float: the guard-rails round
it) plus the state it wants back next tick and the reason. Policies never clamp to min/max, never apply
stabilisation windows and never look at the clock except through ``ctx.now``: `control_plane.scaling.guardrails` does
that
once for all of them. A policy's parameters (``autoscaling.policy.params``) are a typed ``Params`` model,
validated when the stack loads and fixed for the policy's life; ``propose`` reads ``self.params``.

    class MyPolicy(ScalingPolicy, name="my-policy"):
        class Params(PluginParams):
            threshold: float = Field(default=5.0, ge=0)   # ``threshold`` in a stack file
        def propose(self, ctx: ScalingContext) -> Proposal: ...
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from control_plane.scaling.context import ScalingContext
from fleet.spec.plugins import SCALING_POLICY, PluginParams, Registry

__all__ = ["REGISTRY", "Proposal", "ScalingPolicy", "make_policy"]

REGISTRY: Registry[ScalingPolicy] = Registry(SCALING_POLICY)


@dataclass(frozen=True)
class Proposal:
    """A policy's answer: ``desired`` replicas of capacity, why, and the state to carry to the next tick."""

    desired: float
    reason: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    live: float | None = None
    """The part of ``desired`` this tick's load asks for, before capacity a policy holds on purpose (a release
    envelope); None: all of ``desired``. The predictive term scales this one: a trend multiplies what the load
    needs, not what is kept for a burst that already passed."""


class ScalingPolicy(abc.ABC):
    """Base class: subclasses register themselves with ``class X(ScalingPolicy, name="x")``."""

    name: ClassVar[str]
    Params: ClassVar[type[PluginParams]] = PluginParams

    def __init_subclass__(cls, *, name: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        REGISTRY.register(name, cls)

    def __init__(self, params: PluginParams | None = None) -> None:
        del params  # Takes none.

    @abc.abstractmethod
    def propose(self, ctx: ScalingContext) -> Proposal:
        """The desired capacity for ``ctx``; pure: no I/O, no clock but ``ctx.now``."""


def make_policy(name: str, params: Mapping[str, Any] | PluginParams | None = None) -> ScalingPolicy:
    """The policy registered as ``name`` with ``params`` (camelCase keys, as in a stack file).

    `fleet.spec.plugins.UnknownPlugin` lists the registered names; `fleet.spec.plugins.BadParams` names each bad key.
    """
    return REGISTRY.create(name, params)


# Register the shipped policies (imported for their side effect on REGISTRY).
from control_plane.scaling.policies import target_tracking, threshold  # noqa: E402

del target_tracking, threshold
