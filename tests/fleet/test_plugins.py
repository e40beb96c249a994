"""Every plugin registry the spec refers to exists in this tree and holds the names the stacks use."""

from __future__ import annotations

import pytest

from fleet.plugins import PLUGIN_MODULES, registered_names

EXPECTED = {
    "routing filter": {"ready", "serves-model"},
    "routing scorer": {"queue-depth", "kv-usage", "prefix-affinity"},
    "routing picker": {"p2c", "random", "round-robin", "max-score"},
    "scaling policy": {"target-tracking", "threshold"},
    "actuator": {"local", "kubernetes", "aws"},
    "engine kind": {"vllm", "sim"},
}


@pytest.mark.parametrize("kind", sorted(PLUGIN_MODULES))
def test_registry_is_importable_and_complete(kind: str) -> None:
    assert EXPECTED[kind] <= set(registered_names(kind))
