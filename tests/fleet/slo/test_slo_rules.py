"""SLO rules: the shipped stacks' rule files pass `promtool check rules` and `promtool test rules`, every alert and
recording rule has a case that exercises it, and every series the rules read is one the engine and gateway export."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from engine_sim.metrics import ITL_BUCKETS
from fleet.slo.promql_names import metric_names, missing_series
from fleet.slo.rules import (
    VLLM_ITL_BUCKETS,
    edge_at_or_below,
    pool_rule_groups,
    rule_groups,
    rules_yaml,
    ttft_slo_edges,
)
from fleet.spec.loader import list_stacks, load_spec
from fleet.spec.stack import FleetSpec, PoolSpec
from gateway.kv_events import KvEventFeed
from gateway.metrics import GatewayMetrics
from gateway.routing.scorers.kv_cache import KvCache
from tests.fleet.slo.promtool.scenarios import pool_tests
from tests.gateway.conftest import serve_with_admin, settings_for, sim_args
from tests.gateway.test_api import GOLD
from tests.support.procs import Procs
from tests.support.stacks import MODEL, pool

STACKS = list_stacks()


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool's path; missing, a failure in CI (CI=true) and a skip elsewhere."""
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is not installed (Debian/Ubuntu: apt-get install prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def write_unit_tests(
    folder: Path, pool: PoolSpec, groups: list[dict[str, Any]] | None = None, only: Sequence[str] | None = None
) -> Path:
    """``pool``'s rules (``groups``, by default its generated ones) and their unit tests, a file each in ``folder``;
    the tests' path. A file per pool: promtool evaluates every rule of the file in every test."""
    groups = pool_rule_groups(pool) if groups is None else groups
    rules = folder / f"rules-{pool.name}.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    tests = pool_tests(pool, groups, only)
    document = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests}
    path = folder / f"tests-{pool.name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def untested(groups: Sequence[Mapping[str, Any]], tests: Sequence[Mapping[str, Any]]) -> list[str]:
    """Alerts with no case in which they fire, and recording rules with no case checking their value."""
    rules = [rule for group in groups for rule in group["rules"]]
    fired = {t["alertname"] for test in tests for t in test.get("alert_rule_test", []) if t["exp_alerts"]}
    valued = {name for test in tests for t in test.get("promql_expr_test", []) for name in metric_names(t["expr"])}
    missing = [f"alert {r['alert']}" for r in rules if "alert" in r and r["alert"] not in fired]
    return missing + [f"record {r['record']}" for r in rules if "record" in r and r["record"] not in valued]


def _distinct_pools() -> dict[str, PoolSpec]:
    """Every shipped stack's pools, one of each set of identical rules ("stack/pool" of the first): identical
    rules get identical unit tests, and promtool's few seconds a pool are spent once."""
    seen: dict[str, tuple[str, PoolSpec]] = {}
    for stack in STACKS:
        for p in load_spec(stack).spec.pools:
            seen.setdefault(json.dumps(pool_rule_groups(p), sort_keys=True), (f"{stack}/{p.name}", p))
    return dict(seen.values())


POOLS = _distinct_pools()


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_rule_files_pass_promtool_check(stack: str, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(rules_yaml(load_spec(stack).spec))
    checked = _run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("slo_pool", POOLS.values(), ids=list(POOLS))
def test_shipped_pools_rules_pass_their_promtool_unit_tests(slo_pool: PoolSpec, promtool: str, tmp_path: Path) -> None:
    tested = _run(promtool, "test", "rules", write_unit_tests(tmp_path, slo_pool).name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_every_alert_fires_in_some_case_and_every_recording_rule_is_valued(stack: str) -> None:
    for p in load_spec(stack).spec.pools:
        groups = pool_rule_groups(p)
        assert untested(groups, pool_tests(p, groups)) == [], p.name


def test_an_alert_without_a_firing_case_is_reported() -> None:
    slo_pool = pool("local")
    groups = pool_rule_groups(slo_pool)
    tests = pool_tests(slo_pool, groups)
    groups[0]["rules"].append({"alert": "LlmfleetNew", "expr": "vector(1)", "labels": {}, "annotations": {}})
    groups[0]["rules"].append({"record": "llmfleet:pool_new:ratio_rate5m", "expr": "vector(1)"})
    assert untested(groups, tests) == ["alert LlmfleetNew", "record llmfleet:pool_new:ratio_rate5m"]


def _mutated(old: str, new: str) -> tuple[PoolSpec, list[dict[str, Any]]]:
    """The local stack's pool and its rules with ``old`` replaced by ``new`` in every expression."""
    slo_pool = load_spec("local").spec.pools[0]
    groups = pool_rule_groups(slo_pool)
    for rule in groups[0]["rules"]:
        rule["expr"] = rule["expr"].replace(old, new)
    return slo_pool, groups


def test_a_fast_burn_alert_that_outlives_its_burst_fails_the_unit_tests(promtool: str, tmp_path: Path) -> None:
    slo_pool, groups = _mutated("ratio_rate5m{", "ratio_rate30m{")  # the fast burns' short window
    tests = write_unit_tests(tmp_path, slo_pool, groups, only=["availability-burst"])
    tested = _run(promtool, "test", "rules", tests.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "LlmfleetAvailabilityBudgetBurnFast" in tested.stdout + tested.stderr


def test_a_ttft_threshold_off_the_bucket_edges_fails_the_unit_tests(promtool: str, tmp_path: Path) -> None:
    slo_pool, groups = _mutated('le="0.3"', 'le="0.25"')
    tests = write_unit_tests(tmp_path, slo_pool, groups, only=["ttft-burst"])
    tested = _run(promtool, "test", "rules", tests.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "llmfleet:pool_ttft_slow_requests" in tested.stdout + tested.stderr


def test_rules_yaml_is_a_prometheus_rule_file_of_every_pool() -> None:
    spec = load_spec("prod").spec
    document = yaml.safe_load(rules_yaml(spec))
    assert [g["name"] for g in document["groups"]] == [f"llmfleet-{p.name}-slo" for p in spec.pools]
    for rule in (r for g in document["groups"] for r in g["rules"] if "alert" in r):
        assert set(rule["labels"]) == {"severity", "pool"} and rule["annotations"]["summary"]


@pytest.fixture(scope="module")
def engine_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The ``/metrics`` text of a real ``llmfleet sim serve`` process, fresh (every series at zero)."""
    procs = Procs(tmp_path_factory.mktemp("sim"))
    try:
        sim = procs.start(sim_args(), name="sim")
        yield httpx.get(f"{sim.wait_url('API server')}/metrics", timeout=10).raise_for_status().text
    finally:
        procs.close()


def _series_and_recorded(spec: FleetSpec) -> tuple[list[str], set[str]]:
    rules = [rule for group in rule_groups(spec) for rule in group["rules"]]
    return [rule["expr"] for rule in rules], {rule["record"] for rule in rules if "record" in rule}


async def test_rules_read_only_series_and_edges_a_real_gateway_and_simulator_export(procs: Procs) -> None:
    sim = procs.start(sim_args(), name="sim")
    settings = settings_for([sim.wait_url("API server")])
    # Streamed: the gateway times a first token (its TTFT histogram) only on a stream.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True}
    async with serve_with_admin(settings) as (url, admin, _), httpx.AsyncClient(timeout=30) as client:
        answer = await client.post(f"{url}/v1/chat/completions", json=body, headers=GOLD)
        assert answer.status_code == 200 and "data: [DONE]" in answer.text, answer.text
        gateway = (await client.get(f"{admin}/metrics")).text
        engine = (await client.get(f"{sim.url}/metrics")).text
    exprs, recorded = _series_and_recorded(settings.spec)
    assert missing_series(exprs, [engine, gateway], recorded) == []


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_rules_read_only_series_the_simulator_and_gateway_export(
    stack: str, engine_metrics: str
) -> None:
    spec = load_spec(stack).spec
    gateway = GatewayMetrics(ttft_slo_s=ttft_slo_edges(spec))  # as `gateway.app.build_gateway` builds it
    for p in spec.pools:
        gateway.child(gateway.ttft, "t", p.served_name).observe(0.1)
    if "kv-cache" in {s.name for s in spec.gateway.routing.scorers}:  # its KV event feed, as the gateway builds it
        gateway.watch_kv(KvEventFeed({p.name: [KvCache()] for p in spec.pools if p.engine.kv_events}))
    exprs, recorded = _series_and_recorded(spec)
    assert missing_series(exprs, [engine_metrics, gateway.render().decode()], recorded) == []


def test_a_gateway_without_the_slo_edge_or_a_series_vllm_dropped_is_caught(engine_metrics: str) -> None:
    spec = load_spec("prod").spec
    exprs, _ = _series_and_recorded(spec)
    (ttft,) = [e for e in exprs if e.startswith("1 - ") and "ttft" in e and "[5m]" in e]
    plain = GatewayMetrics()
    plain.child(plain.ttft, "t", spec.pools[0].served_name).observe(0.1)
    assert missing_series([ttft], [plain.render().decode()]) == [
        f"llmfleet_gateway_ttft_seconds_bucket{{le='0.3'}} in {ttft!r}"
    ]
    stale = "histogram_quantile(0.99, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket[5m])))"
    assert missing_series([stale], [engine_metrics]) == [f"vllm:time_per_output_token_seconds_bucket in {stale!r}"]


def test_decode_speed_counts_tokens_slower_than_the_itl_edge_at_or_below_the_threshold() -> None:
    assert edge_at_or_below(VLLM_ITL_BUCKETS, 1 / 30) == 0.025
    assert edge_at_or_below(VLLM_ITL_BUCKETS, 1 / 40) == 0.025  # an edge counts as at the threshold
    with pytest.raises(ValueError, match="no histogram edge at or below 0.005 s"):
        edge_at_or_below(VLLM_ITL_BUCKETS, 1 / 200)


def test_the_rules_know_the_simulators_itl_edges() -> None:
    assert VLLM_ITL_BUCKETS == ITL_BUCKETS
