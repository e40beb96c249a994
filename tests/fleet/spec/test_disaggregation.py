"""The ``pools[].disaggregation`` keys: the prefill role pool they derive, and what vLLM refuses of a P/D pair,
refused by ``validate`` with the key and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.spec.loader import parse_spec
from llmfleet.registries import all_registries
from tests.support.stacks import assert_refused, stack_document

PD: dict[str, Any] = {"prefill": {"replicas": {"min": 1, "max": 3}}, "backends": ["LIBFABRIC"]}


def _loaded(**overrides: Any) -> Any:
    document = stack_document("aws", **{"pools.0.disaggregation": PD, **overrides})
    return parse_spec(document, name="aws", registries=all_registries())


def test_a_disaggregated_pool_derives_its_prefill_role_pool() -> None:
    loaded = _loaded()
    pool = loaded.spec.pools[0]
    prefill = pool.prefill_pool()
    assert pool.role == "decode" and prefill is not None and prefill.role == "prefill"
    assert prefill.name == f"{pool.name}-prefill"
    assert (prefill.replicas.min, prefill.replicas.max) == (1, 3)
    assert prefill.served_name == pool.served_name and prefill.engine.version == pool.engine.version
    assert prefill.prefill_pool() is None and not prefill.resume_streams
    assert [p.name for p in loaded.spec.engine_pools] == [pool.name, prefill.name]
    assert loaded.spec.pool(prefill.name).role == "prefill"
    assert [p.name for p in loaded.spec.pools] == [pool.name]  # clients never name the role pool
    assert not [p for p in loaded.warnings if "disaggregation" in p.path]


def test_a_pool_without_the_key_is_aggregated() -> None:
    pool = parse_spec(stack_document("aws"), name="aws", registries=all_registries()).spec.pools[0]
    assert pool.role == "aggregated" and pool.prefill_pool() is None and pool.disaggregation is None


def test_a_prefill_tensor_parallelism_above_the_decode_one_is_refused() -> None:
    document = stack_document("aws", **{"pools.0.disaggregation": {**PD, "prefill": {"tensorParallelSize": 2}}})
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].disaggregation.prefill.tensorParallelSize", "at most")


def test_a_prefill_version_other_than_the_pools_is_refused() -> None:
    document = stack_document("aws", **{"pools.0.disaggregation": {**PD, "prefill": {"version": "0.32.0"}}})
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].disaggregation.prefill.version", "engine.version")


def test_sleep_mode_with_a_backend_nixl_cannot_sleep_on_is_refused() -> None:
    document = stack_document("aws", **{"pools.0.disaggregation": PD, "pools.0.engine.sleepMode": True})
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].disaggregation.backends", "[UCX]")


def test_sleep_mode_on_ucx_passes() -> None:
    loaded = _loaded(**{"pools.0.disaggregation": {**PD, "backends": ["UCX"]}, "pools.0.engine.sleepMode": True})
    assert not [p for p in loaded.warnings if p.level == "error"]


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("connector", "P2pNcclConnector", "NixlConnector"),
        ("backends", ["UCX", "UCX"], "distinct"),
        ("backends", ["TCP"], "UCX"),
        ("kvLoadFailurePolicy", "retry", "recompute"),
        ("thresholdTokens", -1, "greater than or equal"),
        ("sidePort", 1, "sideChannelPort"),
    ],
)
def test_bad_disaggregation_values_name_the_key(key: str, value: object, allowed: str) -> None:
    document = stack_document("aws", **{"pools.0.disaggregation": {**PD, key: value}})
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].disaggregation", allowed)


def test_a_prefill_role_name_that_clashes_with_a_pool_is_refused() -> None:
    document = stack_document("aws", **{"pools.0.disaggregation": PD})
    pools = document["config"]["llmfleet:pools"]
    pools.append({**pools[0], "name": pools[0]["name"] + "-prefill", "servedModelName": "other"})
    pools[1].pop("disaggregation")
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].disaggregation", "another pool has that name")


def test_an_instance_without_efa_is_warned_about() -> None:
    overrides = {
        "gpuNodeGroups": [{"name": "a10g", "instanceType": "g5.12xlarge", "minNodesPerAz": 1, "maxNodesPerAz": 2}],
        "pools.0.nodeGroup": "a10g",
    }
    loaded = _loaded(**overrides)
    assert any("no EFA" in p.message for p in loaded.warnings if p.level == "warning")


def test_the_shipped_pd_stacks_validate() -> None:
    for name in ("local-pd", "local-vllm-pd"):
        loaded = parse_spec(stack_document(name), name=name, registries=all_registries())
        assert loaded.spec.pools[0].role == "decode", name
