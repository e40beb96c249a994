"""Target tracking's gateway terms: the gateways' queue joins queue depth, the observed request rate against the
plan's per-replica QPS warns before the compute cliff, and unknown gateway demand is never read as zero."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.scaling.policies import make_policy
from tests.control_plane.builders import context, ready, starting

IDLE4 = [ready(n, running=10) for n in "abcd"]  # utilisation term: 40 / (64 x 0.75) = 0.83


@pytest.mark.parametrize(
    ("case", "replicas", "gateway", "expected", "signal"),
    [
        ("rate over plan", IDLE4, {"request_rate": 300.0, "per_replica_qps": 40.0}, 10.0, "capacity"),
        # 16 waiting in the gateway / 4 per replica = 4 > 30 req/s / (40 x 0.75) = 1
        (
            "rate under plan",
            IDLE4,
            {"request_rate": 30.0, "per_replica_qps": 40.0, "gateway_waiting": 16.0},
            4.0,
            "queue",
        ),
        ("rate unknown: no capacity term", IDLE4, {"request_rate": None, "per_replica_qps": 40.0}, 40 / 48, "util"),
        ("no plan: no capacity term", IDLE4, {"request_rate": 300.0, "per_replica_qps": None}, 40 / 48, "util"),
        ("gateway queue joins queue depth", [ready("a", waiting=2)], {"gateway_waiting": 38.0}, 10.0, "queue"),
        ("gateway queue unknown", [ready("a", waiting=2)], {"gateway_waiting": None}, 0.5, "queue"),
    ],
)
def test_target_tracking_gateway_terms(
    case: str, replicas: list[Any], gateway: dict[str, Any], expected: float, signal: str
) -> None:
    ctx = context(*replicas, **gateway)
    proposal = make_policy("target-tracking").propose(ctx)
    assert proposal.desired == pytest.approx(expected), case
    assert proposal.reason.startswith(signal), proposal.reason


@pytest.mark.parametrize(
    ("case", "replicas", "gateway", "expected"),
    [
        ("nothing known: hold", [], {}, 0.0),
        ("gateway queue starts an empty pool", [], {"gateway_waiting": 6.0}, 1.5),
        ("gateway rate starts an empty pool", [], {"request_rate": 3.0, "per_replica_qps": 4.0}, 1.0),
        ("never below capacity", [starting("s1"), starting("s2")], {"gateway_waiting": 1.0}, 2.0),
    ],
)
def test_without_engine_metrics_gateway_demand_only_raises(
    case: str, replicas: list[Any], gateway: dict[str, Any], expected: float
) -> None:
    proposal = make_policy("target-tracking").propose(context(*replicas, min_replicas=0, **gateway))
    assert proposal.desired == pytest.approx(expected), case


def test_capacity_term_scales_ahead_of_the_batch_cliff() -> None:
    # Batches at half of maxNumSeqs look comfortable, but the gateways see 90 req/s on a plan of 40 per replica.
    replicas = [ready(n, running=32) for n in "ab"]
    ctx = context(*replicas, request_rate=90.0, per_replica_qps=40.0)
    proposal = make_policy("target-tracking").propose(ctx)
    assert proposal.inputs["utilisation_replicas"] < 2 < proposal.inputs["capacity_replicas"] == 3.0
    assert "90.0 req/s over 20s (now 90.0) / 40.0x0.75" in proposal.reason  # 30 s cold start less the 10 s rate window


def rate_ticks(rates: list[float], interval: float = 10.0, **params: Any) -> list[float]:
    """The capacity term tick after tick (cold start 30 s: the default window) as the gateways report ``rates``."""
    policy = make_policy("target-tracking", {"releaseTimeConstantS": 0, **params})
    state: dict[str, Any] = {}
    out = []
    for i, rate in enumerate(rates):
        ctx = context(*IDLE4, now=1000.0 + i * interval, request_rate=rate, per_replica_qps=10.0, state=state)
        proposal = policy.propose(ctx)
        state = dict(proposal.state)
        out.append(proposal.inputs["capacity_replicas"])
    return out


def test_a_ten_second_burst_does_not_move_the_capacity_term() -> None:
    # 30 req/s on a plan of 10 per replica at 0.75 = 4 replicas; one report of 300 req/s (a ten-second burst).
    assert rate_ticks([30.0, 30.0, 30.0, 300.0, 30.0, 30.0]) == pytest.approx([4.0] * 6)
    # the last report alone (window 0), as before: the burst asks for 40 replicas
    assert max(rate_ticks([30.0, 30.0, 30.0, 300.0, 30.0], sustainWindowS=0)) == pytest.approx(40.0)


def test_a_sustained_rise_moves_the_capacity_term_within_half_the_window() -> None:
    terms = rate_ticks([30.0, 30.0, 30.0, 60.0, 60.0, 60.0])
    assert terms[3] == pytest.approx(4.0)  # one report of the new rate in a 30 s window of three
    assert terms[4:] == pytest.approx([8.0, 8.0])


def test_the_quantile_is_a_parameter_and_old_samples_leave_the_window() -> None:
    assert rate_ticks([30.0, 300.0, 30.0], sustainQuantile=1.0) == pytest.approx([4.0, 40.0, 40.0])
    # 30 s window, 20 s ticks: the burst two ticks back is out of it
    assert rate_ticks([30.0, 300.0, 30.0, 30.0], interval=20.0, sustainQuantile=1.0)[-1] == pytest.approx(4.0)


def test_an_unknown_rate_is_not_read_from_old_samples() -> None:
    policy = make_policy("target-tracking")
    first = policy.propose(context(*IDLE4, request_rate=300.0, per_replica_qps=10.0))
    later = policy.propose(context(*IDLE4, now=1010.0, per_replica_qps=10.0, state=dict(first.state)))
    assert "capacity_replicas" not in later.inputs
    assert [r for _, r in later.state["rates"]] == [300.0]


def queue_ticks(queues: list[float], **params: Any) -> list[float]:
    """The queue term tick after tick (10 s ticks, 30 s window) as the gateways report ``queues`` waiting."""
    policy = make_policy("target-tracking", {"releaseTimeConstantS": 0, **params})
    state: dict[str, Any] = {}
    out = []
    for i, queue in enumerate(queues):
        proposal = policy.propose(context(*IDLE4, now=1000.0 + i * 10, gateway_waiting=queue, state=state))
        state = dict(proposal.state)
        out.append(proposal.inputs["queue_replicas"])
    return out


def test_a_passing_backlog_does_not_move_the_queue_term_a_lasting_one_does() -> None:
    # 8 waiting / 4 per replica = 2 replicas; one tick of 56 waiting (a backlog cleared within the tick)
    assert queue_ticks([8.0, 8.0, 56.0, 8.0]) == pytest.approx([2.0] * 4)
    assert queue_ticks([8.0, 8.0, 56.0, 56.0, 56.0])[-2:] == pytest.approx([14.0, 14.0])
    assert queue_ticks([8.0, 56.0], sustainWindowS=0) == pytest.approx([2.0, 14.0])
