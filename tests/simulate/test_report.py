"""The replay's table: the in-SLO share among requests that could meet the SLO, apart from the TTFT floor."""

from __future__ import annotations

from array import array

from simulate.configs import Config
from simulate.replay import prepare, run_config
from simulate.report import row, table
from simulate.result import Result
from simulate.trace import TraceRequest

LONG_PROMPT = 7000  # prefill alone on an idle replica takes longer than prod's 300 ms TTFT SLO


def small_trace() -> list[TraceRequest]:
    out = [TraceRequest(i * 0.5, f"r{i}", 300, 4) for i in range(20)]
    out.append(TraceRequest(3.2, "long", LONG_PROMPT, 4))
    return sorted(out, key=lambda r: r.t)


def test_prepare_names_the_requests_of_the_ttft_floor() -> None:
    prepared = prepare("prod", small_trace())
    assert prepared.floor_rids == frozenset({"long"})
    assert prepared.slo_infeasible == 1


def test_feasible_share_counts_only_requests_outside_the_floor_and_the_plain_share_all() -> None:
    prepared = prepare("prod", small_trace())
    # 4 arrivals, one in the floor (its 0.9 s TTFT), one feasible request missing (0.5 s), one rejected.
    result = Result("x", requests=4, floor_requests=1, rejected=1)
    result.ttfts = array("d", [0.1, 0.5, 0.9])
    result.feasible_ttfts = array("d", [0.1, 0.5])
    r = row(result, prepared)
    assert r["within_slo"] == 1 / 4
    assert r["within_slo_feasible"] == 1 / 3
    assert "feasible" in table([r]).splitlines()[0]
    assert "33.33%" in table([r]).splitlines()[1]


def test_a_replay_records_the_floor_apart() -> None:
    prepared = prepare("prod", small_trace())
    result = run_config(prepared, Config("p2c", "fixed"), seed=1)
    assert result.floor_requests == 1
    assert len(result.feasible_ttfts) == len(result.ttfts) - 1 == 20
    r = row(result, prepared)
    # idle replicas: every short prompt meets the SLO, the long one cannot
    assert r["within_slo_feasible"] == 1.0
    assert r["within_slo"] == 20 / 21
