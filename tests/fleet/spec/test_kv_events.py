"""The ``engine.kvEvents`` key: off by default, a boolean, and only with the prefix cache the events come from."""

from __future__ import annotations

from fleet.spec.loader import parse_spec
from llmfleet.registries import all_registries
from tests.support.stacks import assert_refused, stack_document


def test_kv_events_are_off_by_default_and_on_with_the_prefix_cache() -> None:
    on = parse_spec(stack_document("aws", **{"pools.0.engine.kvEvents": True}), name="aws", registries=all_registries())
    assert on.spec.pools[0].engine.kv_events and on.spec.pools[0].engine.enable_prefix_caching
    assert not parse_spec(stack_document("aws"), name="aws", registries=all_registries()).spec.pools[0].engine.kv_events


def test_kv_events_without_the_prefix_cache_are_refused_naming_the_key() -> None:
    document = stack_document("aws", **{"pools.0.engine.kvEvents": True, "pools.0.engine.enablePrefixCaching": False})
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].engine.kvEvents", "only with enablePrefixCaching: true")


def test_kv_events_that_are_not_a_boolean_name_the_key() -> None:
    document = stack_document("aws", **{"pools.0.engine.kvEvents": "yes please"})
    assert_refused(document, "Pulumi.aws.yaml", "pools[0].engine.kvEvents", "bool")
