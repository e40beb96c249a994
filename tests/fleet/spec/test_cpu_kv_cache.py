"""The ``engine.cpuKvCacheGib`` key: vLLM on CPU's KV cache in whole GiB, 1 by default, refused with its range."""

from __future__ import annotations

import pytest

from fleet.spec.loader import parse_spec
from llmfleet.registries import all_registries
from tests.support.stacks import assert_refused, stack_document


def test_cpu_kv_cache_is_one_gib_by_default_and_takes_a_whole_number() -> None:
    plain = parse_spec(stack_document("local-sim"), name="local-sim", registries=all_registries())
    assert plain.spec.pools[0].engine.cpu_kv_cache_gib == 1
    document = stack_document("local-sim", **{"pools.0.engine.cpuKvCacheGib": 4})
    loaded = parse_spec(document, name="local-sim", registries=all_registries())
    assert loaded.spec.pools[0].engine.cpu_kv_cache_gib == 4


@pytest.mark.parametrize("value", [0, -1, 4097, 1.5, 2.0, "2", True, None], ids=repr)
def test_a_cpu_kv_cache_that_is_not_a_whole_number_of_gib_in_range_names_the_file_key_and_range(value: object) -> None:
    document = stack_document("local-sim", **{"pools.0.engine.cpuKvCacheGib": value})
    assert_refused(document, "Pulumi.local.yaml", "pools[0].engine.cpuKvCacheGib", "a whole number from 1 to 4096")
