"""Scaling policies: pure functions of a context, checked through one harness for every registered policy."""

from __future__ import annotations

import math

import pytest

from control_plane.scaling.policies import REGISTRY, make_policy
from control_plane.scaling.policies.target_tracking import RELEASE_COLD_STARTS
from fleet.spec.plugins import BadParams
from tests.control_plane.builders import context, ready, stale, starting


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_holds_capacity_without_metrics(name: str) -> None:
    ctx = context(stale("a"), starting("b"))
    proposal = make_policy(name).propose(ctx)
    assert proposal.desired == ctx.capacity == 1
    assert "unknown is not zero" in proposal.reason


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_wants_more_under_a_queue_and_less_when_idle(name: str) -> None:
    policy = make_policy(name)
    busy = context(ready("a", waiting=30, running=60), ready("b", waiting=30, running=60))
    idle = context(ready("a"), ready("b"), ready("c"))
    assert policy.propose(busy).desired > busy.capacity
    assert policy.propose(idle).desired < idle.capacity


@pytest.mark.parametrize(
    ("case", "replicas", "expected", "signal"),
    [
        ("queue of 12 at target 4", [ready("a", waiting=12, running=10)], 3.0, "queue"),
        ("kv 1.5 at target 0.75", [ready("a", kv=0.9), ready("b", kv=0.6)], 2.0, "kv"),
        ("96 running at 64x0.75", [ready("a", running=48), ready("b", running=48)], 2.0, "utilisation"),
        ("idle", [ready("a"), ready("b")], 0.0, "queue"),
    ],
)
def test_target_tracking_takes_the_largest_term(case: str, replicas: list, expected: float, signal: str) -> None:
    proposal = make_policy("target-tracking").propose(context(*replicas))
    assert proposal.desired == pytest.approx(expected), case
    assert proposal.reason.startswith(signal)


def test_target_tracking_params_override_targets() -> None:
    ctx = context(ready("a", waiting=12))
    assert make_policy("target-tracking", {"targetQueuePerReplica": 2}).propose(ctx).desired == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("case", "replicas", "expected"),
    [
        ("avg waiting 6 > 5 adds one", [ready("a", waiting=6, running=10)], 2),
        ("avg waiting 5 holds", [ready("a", waiting=5, running=10)], 1),
        ("idle removes one", [ready("a"), ready("b", running=3)], 1),
        ("starting counts as capacity", [ready("a", waiting=20), starting("b")], 3),
    ],
)
def test_threshold_baseline(case: str, replicas: list, expected: int) -> None:
    assert make_policy("threshold").propose(context(*replicas)).desired == expected, case


def test_unknown_policy_lists_registered_names() -> None:
    with pytest.raises(ValueError, match="target-tracking, threshold"):
        make_policy("nope")


def test_bad_policy_parameter_names_its_key() -> None:
    with pytest.raises(BadParams, match="params.idleFraction: Input should be less than or equal to 1"):
        make_policy("threshold", {"idleFraction": 2})


def test_threshold_parameters_change_the_decision() -> None:
    ctx = context(ready("a", waiting=3, running=10))
    assert make_policy("threshold").propose(ctx).desired == 1
    assert make_policy("threshold", {"threshold": 2}).propose(ctx).desired == 2


TAU_S = RELEASE_COLD_STARTS * 30.0  # the builder's context has a 30 s cold start


@pytest.mark.parametrize(
    ("case", "state", "params", "now", "expected"),
    [
        ("no previous envelope: raw demand", {}, {}, 1000.0, 1.0),
        ("envelope decays by e after tau", {"envelope": (1000.0 - TAU_S, 4.0)}, {}, 1000.0, 4.0 / math.e),
        ("raw demand above the envelope wins", {"envelope": (0.0, 4.0)}, {}, 1000.0, 1.0),
        ("released at once when turned off", {"envelope": (990.0, 4.0)}, {"releaseTimeConstantS": 0}, 1000.0, 1.0),
        ("explicit time constant", {"envelope": (900.0, 4.0)}, {"releaseTimeConstantS": 100}, 1000.0, 4.0 / math.e),
    ],
)
def test_target_tracking_releases_capacity_along_a_decaying_envelope(
    case: str, state: dict, params: dict, now: float, expected: float
) -> None:
    # 48 running of 64x0.75 slots: raw demand is exactly one replica; the default tau is in cold starts (30 s).
    ctx = context(ready("a", running=48), now=now, state=state)
    proposal = make_policy("target-tracking", params).propose(ctx)
    assert proposal.desired == pytest.approx(expected), case
    assert proposal.state["envelope"] == (now, pytest.approx(expected))


def test_target_tracking_counts_a_backlog_in_batches_while_a_cold_start_is_under_way() -> None:
    # 200 waiting + 40 running on one replica: 50 replicas by queue target, 5 by batch slots (240 / 48).
    cold = context(ready("a", waiting=200, running=40), starting("b"))
    warm = context(ready("a", waiting=200, running=40))
    policy = make_policy("target-tracking")
    assert policy.propose(cold).desired == pytest.approx(5.0)
    assert policy.propose(warm).desired == pytest.approx(50.0)


def test_target_tracking_remembers_at_most_the_pool_maximum() -> None:
    # 400 waiting at target 4 asks for 100 replicas of a pool of at most 8: the envelope keeps 8, not 100.
    ctx = context(ready("a", waiting=400, running=64))
    proposal = make_policy("target-tracking").propose(ctx)
    assert proposal.desired == pytest.approx(100.0)
    assert proposal.state["envelope"] == (ctx.now, 8.0)
