"""Stacks: stack documents for tests, from a named preset or a shipped stack, changed by dotted-path overrides.

Presets (the ``config`` mapping of a stack file):

* ``aws``: a valid prod-like AWS stack, one vLLM pool on an a100 node group, two tenants.
* ``local-sim``: a local stack with one simulated pool whose startup, cold start and drain are short.
* ``gateway``: a local stack with two simulated pools and two tenants whose keys are `KEYS`, with a small
  admission queue and short gateway timeouts.
* any other name: the shipped stack of that name (`shipped`), e.g. ``local`` or ``prod``.

Overrides map a dotted path to a value: ``**{"llmfleet:pools.0.engine.maxNumSeqs": 8}``. A first segment
without a namespace is in ``llmfleet:``, so top-level keys read as keywords (``tenants=[...]``) and
``"pools.0.drain.graceSeconds"`` means ``"llmfleet:pools.0.drain.graceSeconds"``. Numbers index lists; missing
mappings on the way are created; a value of `DELETE` removes the key (or list item).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from fleet.protocol.keys import hash_api_key
from fleet.spec.errors import SpecError
from fleet.spec.loader import find_stack, parse_spec
from fleet.spec.stack import FleetSpec, PoolSpec
from llmfleet.registries import all_registries

__all__ = [
    "DELETE",
    "KEYS",
    "MODEL",
    "PRESETS",
    "assert_refused",
    "pool",
    "shipped",
    "spec",
    "stack_document",
    "write_stack",
]

MODEL = "qwen2.5-7b-instruct"  # every preset's first pool serves Qwen2.5-7B-Instruct under this name
KEYS = {"gold": "sk-test-gold", "bronze": "sk-test-bronze", "other": "sk-test-other"}  # "other" is no tenant's

DELETE: Any = object()
ACM_ARN = "arn:aws:acm:us-east-1:123456789012:certificate/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def _qwen_pool(name: str = "qwen-7b", served: str = MODEL, **keys: Any) -> dict[str, Any]:
    """A pool of Qwen/Qwen2.5-7B-Instruct served as ``served``, with ``keys`` (a fresh mapping)."""
    return {"name": name, "model": "Qwen/Qwen2.5-7B-Instruct", "servedModelName": served, **keys}


def _local_stack(environment: str, **config: Any) -> dict[str, Any]:
    """A stack on this machine in one zone; ``config`` holds its other top-level keys, without ``llmfleet:``."""
    values = {"environment": environment, "target": "local", "availabilityZones": ["local-a"], **config}
    return {f"llmfleet:{key}": value for key, value in values.items()}


def _gateway_tenant(name: str, priority: int, **keys: Any) -> dict[str, Any]:
    """A tenant whose API key is ``KEYS[name]``, with limits no test reaches unless it lowers them."""
    limits = {"requestsPerSecond": 10000, "tokensPerMinute": 100_000_000, "maxConcurrency": 10000}
    return {"name": name, "apiKeyHashes": [hash_api_key(KEYS[name])], "priority": priority, **limits, **keys}


PRESETS: dict[str, dict[str, Any]] = {
    "aws": {
        "aws:region": "us-east-1",
        "llmfleet:environment": "prod",
        "llmfleet:target": "aws",
        "llmfleet:availabilityZones": ["us-east-1a", "us-east-1b", "us-east-1c"],
        "llmfleet:gpuNodeGroups": [
            {"name": "a100", "instanceType": "p4de.24xlarge", "minNodesPerAz": 1, "maxNodesPerAz": 2}
        ],
        "llmfleet:pools": [
            _qwen_pool(
                nodeGroup="a100",
                engine={"kind": "vllm", "maxNumSeqs": 256},
                replicas={"min": 3, "max": 12},
                drain={"graceSeconds": 345, "propagationSeconds": 10},  # covers the gateway's totalS (330)
            )
        ],
        "llmfleet:tenants": [
            {"name": "acme", "apiKeysSecret": "tenantKeys:acme", "priority": 8},
            {"name": "research", "apiKeyHashes": [hash_api_key("example-research-key")], "priority": 2},
        ],
        "llmfleet:images": {"runtimeDigest": "sha256:" + "1" * 64, "engineDigest": "sha256:" + "2" * 64},
        # totalS below the NLB TLS listener's fixed 350 s idle timeout; the host name the certificate covers.
        "llmfleet:gateway": {
            "tls": {"certificateArn": ACM_ARN},
            "timeouts": {"totalS": 330},
            "hostname": "api.example.com",
        },
    },
    "local-sim": _local_stack(
        "agenttest",
        pools=[
            _qwen_pool(
                engine={"kind": "sim", "maxNumSeqs": 64, "sim": {"startupSeconds": 0.3, "timeScale": 1.0}},
                coldStartSeconds=20,
                drain={"graceSeconds": 12, "propagationSeconds": 0.5},
            )
        ],
        tenants=[{"name": "t", "apiKeyHashes": ["sha256:" + "0" * 64]}],
    ),
    "gateway": _local_stack(
        "test",
        pools=[
            _qwen_pool(engine={"kind": "sim", "maxNumSeqs": 8, "maxModelLen": 8192}, replicas={"min": 1, "max": 4}),
            _qwen_pool(
                "small",
                "small-model",
                engine={"kind": "sim", "maxNumSeqs": 8, "maxModelLen": 8192},
                replicas={"min": 0, "max": 2},
            ),
        ],
        gateway={
            "replicas": 1,
            "queue": {"perReplicaThreshold": 0, "maxWaiting": 64, "timeoutS": 2},
            "timeouts": {"connectS": 1, "firstTokenS": 5, "totalS": 30},
            "routing": {"scrapeIntervalS": 0.2},
            "maxBodyBytes": 4096,
        },
        tenants=[_gateway_tenant("gold", 8), _gateway_tenant("bronze", 1, allowedModels=[MODEL])],
    ),
}


def shipped(name: str) -> dict[str, Any]:
    """The shipped stack ``name`` (``stacks/Pulumi.<name>.yaml``), parsed."""
    return dict(yaml.safe_load(find_stack(name).read_text()))


def stack_document(preset: str = "aws", /, **overrides: Any) -> dict[str, Any]:
    """A stack document (the YAML's top-level mapping): ``preset``'s, with ``overrides`` applied."""
    document = {"config": copy.deepcopy(PRESETS[preset])} if preset in PRESETS else shipped(preset)
    _apply(document["config"], overrides)
    return document


def write_stack(path: Path, preset: str = "aws", /, **overrides: Any) -> Path:
    """Write `stack_document` to ``path`` (``Pulumi.<stack>.yaml``, so a loader names the stack) and return it."""
    path.write_text(yaml.safe_dump(stack_document(preset, **overrides), sort_keys=False))
    return path


def spec(preset: str = "aws", /, **overrides: Any) -> FleetSpec:
    """`stack_document`, parsed and validated."""
    return parse_spec(stack_document(preset, **overrides), name=preset).spec


def pool(preset: str = "local-sim", /, **overrides: Any) -> PoolSpec:
    """``preset``'s first pool as a PoolSpec; ``overrides`` are dotted paths inside the pool (``engine.kind``)."""
    values = copy.deepcopy(stack_document(preset)["config"]["llmfleet:pools"][0])
    _apply(values, overrides, namespace="")
    return PoolSpec.model_validate(values)


def assert_refused(document: dict[str, Any], file: str, path: str, allowed: str) -> None:
    """Loading ``document`` as ``file`` fails with a problem at ``path`` (a key path under ``llmfleet:``, or its
    start) whose message contains ``allowed``, and the error names the file."""
    try:
        parse_spec(document, file=file, registries=all_registries())
    except SpecError as caught:
        matching = [p for p in caught.problems if p.path.startswith(f"llmfleet:{path}")]
        assert matching, f"no problem at {path}; got {[p.render() for p in caught.problems]}"
        assert any(allowed in p.message for p in matching), [p.render() for p in matching]
        assert file in str(caught)
    else:
        raise AssertionError(f"{file} loaded; expected a problem at {path}")


def _apply(target: dict[str, Any], overrides: dict[str, Any], namespace: str = "llmfleet:") -> None:
    """Set each dotted path in ``overrides`` in ``target`` (see the module docstring)."""
    for dotted, value in overrides.items():
        head, *rest = dotted.split(".")
        if namespace and ":" not in head:
            head = namespace + head
        keys: list[Any] = [head, *(int(part) if part.isdigit() else part for part in rest)]
        node: Any = target
        for key in keys[:-1]:
            node = node[key] if isinstance(node, list) else node.setdefault(key, {})
        if value is DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = copy.deepcopy(value)
