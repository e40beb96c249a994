"""Decisions: what the loop decided for a pool, as plain values an actuator carries out.

A decision never performs I/O; it records the target, the inputs it was computed from and a human reason, so
the decision log (``GET /v1/decisions``) says why each change happened and dry-run mode is just "log, don't act".
The log also keeps each risky change the control plane refused while a pool's error budget was exhausted
(`Freeze`: no actuator acts on it), and each canary rollout's start, steps, holds (when their reason changes),
rollback, promotion or abort (`RolloutStep`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fleet.capacity.paid_floor import Claim

__all__ = ["Decision", "Freeze", "Hold", "RolloutStep", "ScaleDown", "ScaleUp", "claim_of", "decision_to_json"]

Kind = Literal["hold", "scale-up", "scale-down", "freeze", "rollout"]


@dataclass(frozen=True)
class Decision:
    """Common fields: ``current`` is replicas the pool has (ready + starting), ``target`` what it should have."""

    pool: str
    current: int
    target: int
    reason: str
    at: float
    inputs: dict[str, Any] = field(default_factory=dict)
    policy: str = ""
    nodes_for: int | None = None
    """Replicas the pool's nodes should have room for (at least ``target``): what the demand trend needs a node
    start plus a cold start ahead, so nodes are provisioned that much earlier than replicas. None: not modelled."""
    asleep: int = 0
    """Sleeping replicas (sleep mode) the pool keeps once the decision is carried out, on top of ``target``: they
    serve nothing but still hold their GPUs, so an actuator that sets a replica count sets ``holding``."""

    kind: Kind = "hold"

    @property
    def delta(self) -> int:
        return self.target - self.current

    @property
    def holding(self) -> int:
        """Replicas that hold a GPU once the decision is carried out: the awake ``target`` and the ``asleep``."""
        return self.target + self.asleep


@dataclass(frozen=True)
class Hold(Decision):
    kind: Kind = "hold"


@dataclass(frozen=True)
class ScaleUp(Decision):
    """Bring ``target - current`` replicas: wake the sleeping ``wake`` (sleep mode) and start the rest."""

    wake: tuple[str, ...] = ()
    kind: Kind = "scale-up"

    @property
    def starts(self) -> int:
        """New replicas to start: the delta less the sleeping ones woken."""
        return max(0, self.delta - len(self.wake))


@dataclass(frozen=True)
class ScaleDown(Decision):
    """Remove ``victims`` (least-loaded first). With ``drain`` each leaves rotation and finishes its in-flight
    requests before it stops. ``sleep`` (sleep mode) are taken out too, but put to sleep instead of stopped: a
    later scale-up wakes them in about a second."""

    victims: tuple[str, ...] = ()
    drain: bool = True
    sleep: tuple[str, ...] = ()
    kind: Kind = "scale-down"


@dataclass(frozen=True)
class Freeze(Decision):
    """A risky ``change`` (``restart``: a planned-restart lease; ``rollout``) refused while the pool's error
    budget is exhausted; ``current`` and ``target`` are the pool's replicas, unchanged."""

    change: str = ""
    kind: Kind = "freeze"


@dataclass(frozen=True)
class RolloutStep(Decision):
    """A canary rollout's decision for ``alias`` (`rollout.canary`; ``action``: start, hold, step, promote,
    rollback, abort): the candidate's weight from ``weight_from`` to ``weight_to`` percent, the alias's
    ``weights`` after it. ``pool`` is the candidate; ``current`` and ``target`` its replicas, unchanged."""

    alias: str = ""
    action: str = ""
    weight_from: int = 0
    weight_to: int = 0
    weights: dict[str, int] = field(default_factory=dict)
    kind: Kind = "rollout"


def claim_of(decision: Decision) -> Claim | None:
    """What ``decision`` asks of its node group's paid GPUs (`fleet.capacity.paid_floor.Claim`): the replicas it
    wanted before the paid floor, and those holding GPUs once it is carried out (awake, asleep, draining: a
    scale-down's victims drain on their GPUs); None where it noted no want (no paid floor, a startup hold)."""
    want = decision.inputs.get("want")
    if want is None:
        return None
    victims = len(decision.victims) if isinstance(decision, ScaleDown) else 0
    held = decision.holding + int(decision.inputs.get("draining", 0)) + victims
    return Claim(int(want), held)


def decision_to_json(decision: Decision) -> dict[str, Any]:
    """JSON-ready dict of a decision (tuples become lists)."""
    out = asdict(decision)
    for key in ("victims", "wake", "sleep"):
        if key in out:
            out[key] = list(out[key])
    return out
