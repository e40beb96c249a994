"""The ``engine.sleepMode`` key: its type, and the host memory a node needs for its sleeping replicas' weights."""

from __future__ import annotations

import pytest

from fleet.spec.loader import parse_spec
from llmfleet.registries import all_registries
from tests.support.stacks import assert_refused, stack_document


def test_sleep_mode_is_off_by_default_and_passes_on_p4de() -> None:
    loaded = parse_spec(
        stack_document("aws", **{"pools.0.engine.sleepMode": True}), name="aws", registries=all_registries()
    )
    assert loaded.spec.pools[0].engine.sleep_mode
    plain = parse_spec(stack_document("aws"), name="aws", registries=all_registries())
    assert not plain.spec.pools[0].engine.sleep_mode


def test_a_sleep_mode_that_is_not_a_boolean_names_the_key() -> None:
    document = stack_document("aws", **{"pools.0.engine.sleepMode": "sometimes"})
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].engine.sleepMode", "bool")


@pytest.mark.parametrize("sleep_mode", [True, False])
def test_sleep_mode_needs_host_memory_for_the_weights_of_every_sleeping_replica(sleep_mode: bool) -> None:
    # g5.xlarge: one 24 GB A10G and 16 GiB of host memory; 9e9 BF16 parameters are 16.8 GiB of weights.
    overrides = {
        "gpuNodeGroups": [{"name": "a10g", "instanceType": "g5.xlarge", "minNodesPerAz": 1, "maxNodesPerAz": 2}],
        "pools.0.nodeGroup": "a10g",
        "pools.0.model": "acme/nine-b",
        "pools.0.modelFacts": {
            "parameters": 9e9, "layers": 32, "hiddenSize": 4096, "kvHeads": 8, "headDim": 128,
            "vocabSize": 32000, "maxPosition": 8192,
        },
        "pools.0.engine.maxModelLen": 2048,
        "pools.0.engine.sleepMode": sleep_mode,
    }  # fmt: skip
    document = stack_document("aws", **overrides)
    if sleep_mode:
        assert_refused(document, "Pulumi.aws.yaml", "pools[0].engine.sleepMode", "16 GiB of host memory")
    else:
        parse_spec(document, name="aws", registries=all_registries())
