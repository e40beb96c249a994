"""This gateway's share of a pool's admission capacity (`gateway.shares`)."""

from __future__ import annotations

from gateway.admission import Admission
from gateway.shares import CapacityShares
from tests.gateway.builders import ManualClock


def test_without_a_control_plane_the_gateway_admits_the_whole_pool() -> None:
    shares = CapacityShares(controlled=False, floor=0.5, hold_s=5.0, clock=ManualClock())
    shares.update("p", 0.25)
    assert shares.capacity("p", 96) == 96


def test_the_floor_holds_until_a_share_arrives_and_again_once_it_is_stale() -> None:
    now, changed = ManualClock(), []
    shares = CapacityShares(controlled=True, floor=0.5, hold_s=5.0, clock=now, on_change=changed.append)
    assert shares.capacity("p", 96) == 48
    shares.update("p", 0.3)
    assert (shares.capacity("p", 96), changed) == (29, ["p"])  # 28.8, rounded
    now.now = 5.0
    assert shares.capacity("p", 96) == 29
    now.now = 5.1  # the control plane went quiet
    assert shares.capacity("p", 96) == 48


def test_a_tiny_share_still_admits_one_request_and_no_replica_admits_none() -> None:
    shares = CapacityShares(controlled=True, floor=0.5, hold_s=5.0, clock=ManualClock())
    shares.update("p", 0.001)
    assert (shares.capacity("p", 96), shares.capacity("p", 0)) == (1, 0)


def test_an_unchanged_share_does_not_call_on_change_and_none_keeps_the_floor() -> None:
    changed: list[str] = []
    shares = CapacityShares(controlled=True, floor=0.5, hold_s=5.0, clock=ManualClock(), on_change=changed.append)
    shares.update("p", None)
    shares.update("p", 0.5)  # equal to the floor it already used
    assert changed == [] and shares.share("p") == 0.5


async def test_admission_demand_counts_in_flight_and_waiting_by_priority() -> None:
    admission = Admission(max_waiting=10, timeout_s=5.0, clock=ManualClock())
    admission.set_capacity(2)
    high = await admission.acquire("gold", 9)
    low = await admission.acquire("bronze", 1)
    assert admission.demand() == {1: 1, 9: 1}
    low.release()
    assert admission.demand() == {9: 1}
    high.release()
    assert admission.demand() == {}
