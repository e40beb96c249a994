"""Draft: a proposal on its way through the guard-rails, and the guard-rails' own state between ticks.

Every guard-rail step (`control_plane.scaling.guardrails.GUARDRAILS`) takes a `Draft` and returns the next one;
none changes one in place. `GuardrailState` is what the steps carry from one tick of a pool to the next. It is
typed and kept apart from the policy's own state (``Proposal.state``), so no policy key can overwrite it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from control_plane.scaling.policies import Proposal

__all__ = ["EPS", "Draft", "GuardrailState", "median"]

EPS = 1e-9  # proposals like 2.0000000001 from float sums must not round up to 3


def median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


@dataclass(frozen=True)
class GuardrailState:
    """What the guard-rails remember of a pool between ticks."""

    # (t, queue depth) of the ticks of the last ``ttftQueueWindowS`` (the TTFT rule's queueing evidence)
    ttft_queues: tuple[tuple[float, float], ...] = ()
    # (t, desired replicas) of the ticks within the longer stabilisation window
    recommendations: tuple[tuple[float, int], ...] = ()
    # since when the pool has continuously wanted more (or fewer) replicas than its capacity; None: not now
    above_since: float | None = None
    below_since: float | None = None


@dataclass(frozen=True)
class Draft:
    """The guarded answer so far: each step reads the previous step's numbers and returns its own."""

    proposal: Proposal  # the policy's answer, as it came
    desired: int  # replicas of capacity wanted (steps 1-5)
    reason: str
    inputs: Mapping[str, Any]  # the figures the decision log shows, in the order the steps added them
    state: GuardrailState
    capacity: int  # the capacity to run (steps 6-7: stabilised and step-limited); starts as the current capacity
    no_shrink: str | None = None  # why the pool may not shrink this tick (the first SLO rule that says so)
    target: int = 0  # the replica target (step 8: the capacity translated back to replicas)
    nodes_for: int | None = None  # replicas to provision nodes for (step 9)

    def note(self, key: str, value: Any) -> Draft:
        """This draft with ``inputs[key] = value`` added."""
        return replace(self, inputs={**self.inputs, key: value})
