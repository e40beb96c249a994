"""Builders of stack documents for the fleet-spec tests."""

from __future__ import annotations

import copy
from typing import Any

from fleet.validate import DEMO_API_KEY, hash_api_key

BASE_POOL: dict[str, Any] = {
    "name": "qwen-7b",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "servedModelName": "qwen2.5-7b-instruct",
    "nodeGroup": "a100",
    "engine": {"kind": "vllm", "maxNumSeqs": 256},
    "replicas": {"min": 3, "max": 12},
}

BASE: dict[str, Any] = {
    "aws:region": "us-east-1",
    "llmfleet:environment": "prod",
    "llmfleet:target": "aws",
    "llmfleet:availabilityZones": ["us-east-1a", "us-east-1b", "us-east-1c"],
    "llmfleet:gpuNodeGroups": [
        {"name": "a100", "instanceType": "p4de.24xlarge", "minNodesPerAz": 1, "maxNodesPerAz": 2}
    ],
    "llmfleet:pools": [BASE_POOL],
    "llmfleet:tenants": [
        {"name": "acme", "apiKeysSecret": "tenantKeys:acme", "priority": 8},
        {"name": "research", "apiKeyHashes": [hash_api_key("example-research-key")], "priority": 2},
    ],
}


def stack(**overrides: Any) -> dict[str, Any]:
    """A valid prod-like stack document; ``overrides`` map dotted paths (``llmfleet:pools.0.engine.x``) to values.

    A value of ``DELETE`` removes the key.
    """
    config = copy.deepcopy(BASE)
    for dotted, value in overrides.items():
        set_path(config, dotted, value)
    return {"config": config}


DELETE = object()


def set_path(config: dict[str, Any], dotted: str, value: Any) -> None:
    head, *rest = dotted.split(".")
    target: Any = config
    keys: list[Any] = [head, *(int(p) if p.isdigit() else p for p in rest)]
    for key in keys[:-1]:
        target = target[key]
    if value is DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value


DEMO_HASH = hash_api_key(DEMO_API_KEY)
