"""The replay's table: the in-SLO share among requests that could meet the SLO, apart from the TTFT floor."""

from __future__ import annotations

import math
from array import array

import pytest

from simulate.configs import Config
from simulate.replay import prepare, run_config
from simulate.report import miss_split, oracle_shares, row, table
from simulate.result import Result, busy_spread
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


def _cached(name: str, cached: int, prompt: int = 1000) -> Result:
    return Result(name, requests=1, prompt_tokens=prompt, cached_tokens=cached)


def test_the_oracle_share_is_cached_tokens_over_the_oracle_routers_of_the_same_fleet_size() -> None:
    prepared = prepare("prod", small_trace())
    results = [
        _cached("p2c+kv / fixed 5", 450),
        _cached("oracle-kv / fixed 5", 500),
        _cached("p2c+prefix / fixed 8", 540, prompt=900),  # its own prompt total: the share is of tokens
        _cached("oracle-kv / fixed 8", 600),
        _cached("p2c / target-tracking", 300),  # no oracle row of this scaling
    ]
    rows = oracle_shares([row(r, prepared) for r in results])
    assert [r["oracle_share"] for r in rows[:4]] == [0.9, 1.0, 0.9, 1.0]
    assert math.isnan(float(rows[4]["oracle_share"]))
    lines = table(rows).splitlines()
    assert "/oracle" in lines[0]
    # /oracle comes before spread, preempt and wall
    assert [line.split()[-4] for line in lines[1:]] == ["90.0%", "100.0%", "90.0%", "100.0%", "-"]
    assert "/oracle" not in table([row(results[4], prepared)]).splitlines()[0]


def test_the_miss_split_adds_up_to_the_rows_miss() -> None:
    prepared = prepare("prod", small_trace())
    rows = oracle_shares(
        [row(_cached("p2c+kv / fixed 5", 450), prepared), row(_cached("oracle-kv / fixed 5", 500), prepared)]
    )
    (kv, oracle) = miss_split(rows, ceiling=0.7)
    assert kv.endswith(
        "miss 55.0% = 30.0% the workload cannot reuse + 20.0% the fleet's KV memory cannot hold + 5.0% lost by routing"
    )
    assert oracle.endswith("+ 0.0% lost by routing")


def test_the_load_spread_is_the_busiest_replicas_share_over_the_mean() -> None:
    assert busy_spread([(30.0, 100.0), (10.0, 100.0), (20.0, 100.0)]) == pytest.approx(1.5)
    assert busy_spread([(10.0, 50.0), (20.0, 100.0)]) == 1.0  # shares, not seconds: a replica launched later
    assert math.isnan(busy_spread([]))
