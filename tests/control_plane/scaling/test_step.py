"""The decision step carries the policy's state and the guard-rails' state apart: neither overwrites the other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.decisions import ScaleDown
from control_plane.scaling.policies import Proposal, ScalingPolicy
from control_plane.scaling.step import ScalingState, decide
from tests.control_plane.builders import ready
from tests.support import stacks


class NamesGuardrailKeys:
    """Wants one replica, and keeps state under a key the stabilisation window also uses (a policy by shape,
    left out of the registry)."""

    name = "names-guardrail-keys"

    def __init__(self) -> None:
        self.seen: list[Mapping[str, Any]] = []

    def propose(self, ctx: ScalingContext) -> Proposal:
        self.seen.append(dict(ctx.state))
        return Proposal(1.0, "one is enough", state={"below_since": None, "mine": ctx.now})


def test_a_policy_state_key_named_like_a_guardrail_key_does_not_clobber_it() -> None:
    spec = stacks.spec(
        "local", **{"pools.0.replicas": {"min": 1, "max": 4}, "autoscaling.scaleDownStabilizationS": 60.0}
    )
    pool, policy = spec.pools[0], NamesGuardrailKeys()
    state = ScalingState()
    kinds = []
    for now in (0.0, 30.0, 60.0):
        step = decide(pool, spec.autoscaling, cast(ScalingPolicy, policy), (ready("a"), ready("b")), now, state=state)
        state = step.state
        kinds.append(step.decision.kind)
    # The scale-down clock started at 0 s and ran on, although the policy said ``below_since: None`` every tick.
    assert kinds == ["hold", "hold", "scale-down"] and isinstance(step.decision, ScaleDown)
    assert state.guardrails.below_since == 0.0
    # The policy gets back its own state only, as it returned it.
    assert policy.seen == [{}, {"below_since": None, "mine": 0.0}, {"below_since": None, "mine": 30.0}]
