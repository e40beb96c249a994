"""Sleep mode in the decision step: a scale-down sleeps ready replicas instead of stopping them (up to
``replicas.max`` in all), a scale-up wakes sleeping replicas before it starts new ones."""

from __future__ import annotations

from typing import Any, cast

import pytest

from control_plane.scaling.context import ReplicaLoad, ScalingContext
from control_plane.scaling.decisions import Hold, ScaleDown, ScaleUp, decision_to_json
from control_plane.scaling.policies import Proposal, ScalingPolicy
from control_plane.scaling.step import decide
from tests.control_plane.builders import autoscaling, ready, starting
from tests.support import stacks


class Wants:
    """A policy (by shape) that wants ``n`` replicas, whatever the load."""

    name = "wants"

    def __init__(self, n: int) -> None:
        self.n = n

    def propose(self, ctx: ScalingContext) -> Proposal:
        return Proposal(float(self.n), f"wants {self.n}")


def asleep(name: str) -> ReplicaLoad:
    return ReplicaLoad(name, "sleeping", waiting=0, running=0, kv_usage=0.0)


def failed(name: str) -> ReplicaLoad:
    return ReplicaLoad(name, "failed")


def step(replicas: tuple[ReplicaLoad, ...], wants: int, sleep_mode: bool = True, max_replicas: int = 4) -> Any:
    pool = stacks.pool(**{"engine.sleepMode": sleep_mode, "replicas": {"min": 0, "max": max_replicas}})
    rails = autoscaling(scale_down_stabilization_s=0.0, max_scale_down_step=4, max_scale_up_step=4)
    return decide(pool, rails, cast(ScalingPolicy, Wants(wants)), replicas, 1000.0).decision


@pytest.mark.parametrize(
    ("name", "replicas", "wants", "sleep_mode", "max_replicas", "expected"),
    [
        (
            "down: ready replicas sleep",
            (ready("a"), ready("b"), ready("c")),
            1,
            True,
            4,
            {"kind": "scale-down", "sleep": ["a", "b"], "victims": [], "holding": 3},
        ),
        (
            "down without sleep mode: they stop",
            (ready("a"), ready("b"), ready("c")),
            1,
            False,
            4,
            {"kind": "scale-down", "sleep": [], "victims": ["a", "b"], "holding": 1},
        ),
        (
            "down: at most max - target sleep in all",
            (ready("a"), ready("b"), asleep("z")),
            1,
            True,
            2,
            {"kind": "scale-down", "sleep": [], "victims": ["a"], "holding": 2},
        ),
        (
            "down: a failed replica stops, a ready one sleeps",
            (failed("f"), ready("a"), ready("b")),
            0,
            True,
            4,
            {"kind": "scale-down", "sleep": ["a"], "victims": ["f"], "holding": 2},
        ),
        (
            "up: sleeping replicas wake first",
            (ready("a"), asleep("y"), asleep("z")),
            3,
            True,
            4,
            {"kind": "scale-up", "wake": ["y", "z"], "starts": 0, "holding": 3},
        ),
        (
            "up: then new ones start",
            (ready("a"), asleep("z")),
            3,
            True,
            4,
            {"kind": "scale-up", "wake": ["z"], "starts": 1, "holding": 3},
        ),
        (
            "up without sleep mode: starts only",
            (ready("a"), starting("b")),
            3,
            False,
            4,
            {"kind": "scale-up", "wake": [], "starts": 1, "holding": 3},
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_sleep_mode_decisions(
    name: str,
    replicas: tuple[ReplicaLoad, ...],
    wants: int,
    sleep_mode: bool,
    max_replicas: int,
    expected: dict[str, Any],
) -> None:
    del name  # Unused: the case's id.
    decision = step(replicas, wants, sleep_mode, max_replicas)
    out = decision_to_json(decision)
    if isinstance(decision, ScaleUp):
        out["starts"] = decision.starts
    out["holding"] = decision.holding  # what holds a GPU after it: the replica count a Deployment is set to
    assert {k: out[k] for k in expected} == expected


def test_sleeping_replicas_are_not_current_capacity() -> None:
    decision = step((ready("a"), asleep("z")), 1)
    assert isinstance(decision, Hold) and decision.current == 1 and decision.holding == 2


def test_a_sleeping_replica_is_never_a_victim() -> None:
    decision = step((ready("a"), asleep("y"), asleep("z")), 0, max_replicas=3)
    assert isinstance(decision, ScaleDown) and decision.sleep == ("a",) and decision.victims == ()
