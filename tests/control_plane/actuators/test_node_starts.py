"""The node-start ledger: orders matched to the nodes that answer them, each start counted once, from the raise."""

from __future__ import annotations

import logging

import pytest

from control_plane.actuators.node_starts import ORDER_EXPIRES_S, NodeSeen, NodeStartLedger

T0 = 1_000_000.0


def seen(
    name: str,
    created: float,
    ready: float | None = None,
    scheduled: float | None = None,
    running: float | None = None,
    zone: str = "us-east-1a",
) -> NodeSeen:
    return NodeSeen(name, zone, T0 + created, _at(ready), _at(scheduled), _at(running))


def _at(offset: float | None) -> float | None:
    return None if offset is None else T0 + offset


def test_a_node_is_timed_from_the_raise_to_its_first_engine_running() -> None:
    ledger = NodeStartLedger()
    ledger.ordered("a100", "us-east-1a", 1, T0)
    # boot + join 150 s, Ready at 190 s, the engine pod scheduled at 200 s and running at 440 s (a 240 s pull)
    starts = ledger.observe("a100", [seen("n1", 150, 190, 200, 440)], T0 + 450, node_cold_start_s=600)
    assert [(s.node, s.registered_s, s.ready_s, s.pull_s, s.start_s) for s in starts] == [
        ("n1", 150.0, 190.0, 240.0, 430.0)
    ]
    summary = ledger.summary("a100", 600)
    assert summary is not None and (summary.count, summary.p50_s, summary.node_cold_start_s) == (1, 430.0, 600)
    assert ledger.observe("a100", [seen("n1", 150, 190, 200, 440)], T0 + 460, 600) == []  # counted once


def test_a_node_that_waited_idle_is_not_read_as_slow() -> None:
    # Ready at 190 s, but no engine was scheduled onto it until 1,000 s: the pull counts from the scheduling.
    ledger = NodeStartLedger()
    ledger.ordered("a100", "us-east-1a", 1, T0)
    (start,) = ledger.observe("a100", [seen("n1", 150, 190, 1000, 1060)], T0 + 1100, 600)
    assert (start.ready_s, start.pull_s, start.start_s) == (190.0, 60.0, 250.0)


def test_nodes_there_before_the_order_and_nodes_in_other_zones_are_not_timed() -> None:
    ledger = NodeStartLedger()
    ledger.ordered("a100", "us-east-1a", 1, T0)
    old = seen("old", -5000, -4900, -4800, -4700)
    elsewhere = seen("b1", 100, 150, 160, 200, zone="us-east-1b")
    assert ledger.observe("a100", [old, elsewhere], T0 + 300, 600) == []
    # the order is still open: the zone's node, when it comes, takes it
    (start,) = ledger.observe("a100", [old, elsewhere, seen("a1", 200, 230, 240, 300)], T0 + 400, 600)
    assert start.node == "a1" and start.start_s == 290.0


def test_orders_are_answered_oldest_first_and_a_node_waits_for_its_engine() -> None:
    ledger = NodeStartLedger()
    ledger.ordered("a100", "us-east-1a", 1, T0)
    ledger.ordered("a100", "us-east-1a", 1, T0 + 100)
    pending = seen("n1", 120, 160)  # Ready, no engine yet: matched to the first order, not counted
    assert ledger.observe("a100", [pending], T0 + 200, 600) == []
    nodes = [seen("n1", 120, 160, 170, 230), seen("n2", 300, 330, 340, 400)]
    starts = ledger.observe("a100", nodes, T0 + 500, 600)
    assert [(s.node, s.start_s) for s in starts] == [("n1", 220.0), ("n2", 290.0)]  # n2 answers the raise at +100


def test_an_order_no_node_answers_expires() -> None:
    ledger = NodeStartLedger()
    ledger.ordered("a100", "us-east-1a", 1, T0)
    assert ledger.observe("a100", [], T0 + ORDER_EXPIRES_S + 1, 600) == []
    # a node long after is somebody else's: with the order dropped it is not timed against it
    assert ledger.observe("a100", [seen("late", ORDER_EXPIRES_S + 10, ORDER_EXPIRES_S + 20)], T0 + 4000, 600) == []
    assert ledger.summary("a100", 600) is None


def test_a_median_slower_than_node_cold_start_seconds_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    ledger = NodeStartLedger()
    ledger.ordered("a100", "us-east-1a", 2, T0)
    nodes = [seen("n1", 300, 500, 510, 800), seen("n2", 320, 520, 530, 860)]
    with caplog.at_level(logging.WARNING, logger="llmfleet.control_plane.node_starts"):
        ledger.observe("a100", nodes, T0 + 800, node_cold_start_s=600)
    assert "median start is 790 s over 2 nodes, nodeColdStartSeconds says 600 s" in caplog.text
    caplog.clear()
    quick = NodeStartLedger()
    quick.ordered("a100", "us-east-1a", 2, T0)
    with caplog.at_level(logging.WARNING, logger="llmfleet.control_plane.node_starts"):
        quick.observe("a100", nodes, T0 + 800, node_cold_start_s=900)
    assert caplog.text == ""
