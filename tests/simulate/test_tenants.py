"""Tenants in the replay: a trace split among N tenants by a seeded hash, each request salted as the gateway salts
it; with a cache per tenant the prefixes tenants share stop hitting, with one tenant nothing changes, and the
oracle and the infinite-cache ceiling key blocks by the salt as the engine does."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.cache_salt import CacheSalts
from llmfleet.cli import main
from simulate.bounds import infinite_cache_hit_rate
from simulate.configs import Config
from simulate.kv_oracle import prefix_cache_keys
from simulate.prompts import prompt_tokens
from simulate.replay import prepare, run_config
from simulate.report import row
from simulate.tenants import isolated, request_key, split, tenant_of
from simulate.trace import TraceRequest
from tests.simulate.test_cli import write_trace
from tests.simulate.test_kv_routing import shared_prefix_trace


def test_each_request_goes_to_one_tenant_drawn_by_a_seeded_hash_of_its_id() -> None:
    trace = shared_prefix_trace(2000)
    first, again = split(trace, 4, seed=7, isolated=False), split(trace, 4, seed=7, isolated=False)
    assert [r.tenant for r in first] == [r.tenant for r in again]
    assert [r.tenant for r in first] != [r.tenant for r in split(trace, 4, seed=8, isolated=False)]
    counts = Counter(r.tenant for r in first)
    assert sorted(counts) == ["tenant-0", "tenant-1", "tenant-2", "tenant-3"]
    assert all(400 <= n <= 600 for n in counts.values()), counts  # 500 each, give or take 4.5 sigma
    assert all(r.cache_salt is None for r in first)  # shared: tenants named, one cache


def test_a_rate_scaled_copy_keeps_its_originals_tenant() -> None:
    original = TraceRequest(1.0, "trace.v2-17", 100, 4)
    copy = replace(original, rid="trace.v2-17.3")
    assert request_key(copy) == request_key(original) == "trace.v2-17"
    assert tenant_of(request_key(copy), 9, 1) == tenant_of(request_key(original), 9, 1)


def test_isolated_requests_carry_their_tenants_gateway_salt() -> None:
    salts = CacheSalts.from_engine_key(None)
    for r in split(shared_prefix_trace(50), 3, seed=7, isolated=True):
        assert r.cache_salt == salts.for_tenant(r.tenant)


@pytest.mark.parametrize("tenants", [0, -1, 10_001])
def test_a_tenant_count_out_of_range_is_refused(tenants: int) -> None:
    with pytest.raises(ValueError, match="--tenants"):
        split(shared_prefix_trace(3), tenants, seed=7, isolated=True)


def test_the_oracle_and_the_ceiling_key_blocks_by_the_salt_as_the_engine_does() -> None:
    request = TraceRequest(0.0, "a", 2300, 4, (11, 12, 13, 14))
    tokens = prompt_tokens(request, 0)
    assert prefix_cache_keys(tokens, cache_salt="s1") != prefix_cache_keys(tokens, cache_salt="s2")
    assert prefix_cache_keys(tokens, cache_salt=None) == prefix_cache_keys(tokens)
    twice = [request, replace(request, t=1.0, rid="b")]
    assert infinite_cache_hit_rate(twice) > 0.4
    apart = [replace(twice[0], cache_salt="s1"), replace(twice[1], cache_salt="s2")]
    assert infinite_cache_hit_rate(apart) == 0.0
    assert infinite_cache_hit_rate([replace(r, cache_salt="s1") for r in twice]) == infinite_cache_hit_rate(twice)


@pytest.mark.parametrize("routing", ["p2c+kv", "oracle-kv"])
def test_a_cache_per_tenant_loses_the_prefixes_tenants_share_and_one_tenant_loses_nothing(routing: str) -> None:
    trace = shared_prefix_trace(300, groups=12)  # 12 prefixes, each sent by every tenant
    hits: dict[tuple[int, bool], float] = {}
    for tenants in (1, 4):
        shared = prepare("prod", split(trace, tenants, seed=7, isolated=False))
        for prepared, salted in ((shared, False), (isolated(shared, tenants, 7), True)):
            result = row(run_config(prepared, Config(routing, "fixed", 3), 7), prepared)
            hits[(tenants, salted)] = float(result["hit"])
        assert isolated(shared, tenants, 7).pool == shared.pool  # the same fleet and plan either way
    assert hits[(1, True)] == hits[(1, False)] > 0.5  # one tenant: its salt changes nothing
    assert hits[(4, False)] == hits[(1, False)]  # tenant names alone change nothing either
    assert hits[(4, True)] < hits[(4, False)] - 0.05  # four caches: each prefix's first send is a miss four times


def test_simulate_with_tenants_prints_shared_and_isolated_rows_and_the_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace)
    argv = ["simulate", "--stack", "prod", "--trace", str(trace), "--jobs", "1", "--fixed", "3"]
    assert main([*argv, "--routing", "p2c+kv", "--tenants", "3"]) == 0
    out = capsys.readouterr().out
    assert "tenants: 3" in out and "isolated" in out
    assert [line.split()[0] for line in out.splitlines() if "[shared]" in line or "[isolated]" in line] == [
        "p2c+kv",
        "p2c+kv",
    ]
    assert "what isolation costs (3 tenants" in out and "p2c+kv / fixed 3: hit" in out
    assert main([*argv, "--tenants", "2", "--frontier"]) == 2
    assert "--tenants" in capsys.readouterr().err
