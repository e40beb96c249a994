"""Builders for gateway tests: endpoint snapshots, request infos and small stacks."""

from __future__ import annotations

import copy
from typing import Any

from fleet.loader import parse_spec
from fleet.spec import FleetSpec
from fleet.validate import hash_api_key
from gateway.routing.base import EndpointView, RequestInfo

MODEL = "qwen2.5-7b-instruct"
KEYS = {"gold": "sk-test-gold", "bronze": "sk-test-bronze", "other": "sk-test-other"}


def endpoint(rid: str = "a", **overrides: Any) -> EndpointView:
    values: dict[str, Any] = {
        "id": rid,
        "url": f"http://{rid}",
        "pool": "qwen-7b",
        "model": MODEL,
        "ready": True,
        "ejected": False,
        "metrics_age_s": 0.1,
        "running": 0.0,
        "waiting": 0.0,
        "kv_usage": 0.0,
        "in_flight": 0,
        "max_num_seqs": 8,
    }
    values.update(overrides)
    return EndpointView(**values)


def request(**overrides: Any) -> RequestInfo:
    values: dict[str, Any] = {
        "request_id": "r1",
        "model": MODEL,
        "tenant": "gold",
        "priority": 5,
        "prompt": "",
        "session_id": None,
        "now": 0.0,
    }
    values.update(overrides)
    return RequestInfo(**values)


BASE_CONFIG: dict[str, Any] = {
    "llmfleet:environment": "test",
    "llmfleet:target": "local",
    "llmfleet:availabilityZones": ["local-a"],
    "llmfleet:pools": [
        {
            "name": "qwen-7b",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "servedModelName": MODEL,
            "engine": {"kind": "sim", "maxNumSeqs": 8, "maxModelLen": 8192},
            "replicas": {"min": 1, "max": 4},
        },
        {
            "name": "small",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "servedModelName": "small-model",
            "engine": {"kind": "sim", "maxNumSeqs": 8, "maxModelLen": 8192},
            "replicas": {"min": 0, "max": 2},
        },
    ],
    "llmfleet:gateway": {
        "replicas": 1,
        "queue": {"perReplicaThreshold": 0, "maxWaiting": 64, "timeoutS": 2},
        "timeouts": {"connectS": 1, "firstTokenS": 5, "totalS": 30},
        "routing": {"scrapeIntervalS": 0.2},
        "maxBodyBytes": 4096,
    },
    "llmfleet:tenants": [
        {
            "name": "gold",
            "apiKeyHashes": [hash_api_key(KEYS["gold"])],
            "priority": 8,
            "requestsPerSecond": 10000,
            "tokensPerMinute": 100_000_000,
            "maxConcurrency": 10000,
        },
        {
            "name": "bronze",
            "apiKeyHashes": [hash_api_key(KEYS["bronze"])],
            "priority": 1,
            "requestsPerSecond": 10000,
            "tokensPerMinute": 100_000_000,
            "maxConcurrency": 10000,
            "allowedModels": [MODEL],
        },
    ],
}


def fleet_spec(**overrides: Any) -> FleetSpec:
    """A small local stack; ``overrides`` replace top-level keys (``gateway=...``, ``tenants=...``)."""
    config = copy.deepcopy(BASE_CONFIG)
    for key, value in overrides.items():
        config[f"llmfleet:{key}"] = value
    return parse_spec({"config": config}, name="test").spec


def gateway_config(**overrides: Any) -> dict[str, Any]:
    """BASE_CONFIG's gateway block with nested overrides merged one level deep."""
    config: dict[str, Any] = copy.deepcopy(BASE_CONFIG["llmfleet:gateway"])
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config
