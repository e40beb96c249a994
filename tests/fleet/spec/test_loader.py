"""A broken stack file fails with the file, the full key path and what is allowed; all problems at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.protocol.keys import DEMO_API_KEY, hash_api_key
from fleet.spec.errors import SpecError
from fleet.spec.loader import list_stacks, load_spec, parse_spec
from llmfleet.registries import all_registries
from tests.support.stacks import DELETE, stack_document, write_stack


@pytest.mark.parametrize("name", list_stacks())
def test_every_shipped_stack_validates(name: str) -> None:
    loaded = load_spec(name, registries=all_registries())
    assert loaded.spec.pools
    assert not [w for w in loaded.warnings if w.level == "error"]


def test_the_base_document_of_these_tests_is_valid() -> None:
    parse_spec(stack_document("aws"), file="ok.yaml")


# (case, overrides, expected key path, fragment of the message saying what is allowed)
BROKEN: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "utilisation above the ceiling",
        {"llmfleet:pools.0.engine.gpuMemoryUtilization": 1.3},
        "llmfleet:pools[0].engine.gpuMemoryUtilization",
        "less than or equal to 0.98",
    ),
    (
        "misspelt engine key",
        {"llmfleet:pools.0.engine.maxNumSeq": 64},
        "llmfleet:pools[0].engine.maxNumSeq",
        "did you mean 'maxNumSeqs'",
    ),
    (
        "misspelt top-level key",
        {"llmfleet:availabilityZone": ["us-east-1a"]},
        "llmfleet:availabilityZone",
        "did you mean 'availabilityZones'",
    ),
    (
        "replicas min above max",
        {"llmfleet:pools.0.replicas": {"min": 5, "max": 2}},
        "llmfleet:pools[0]",
        "must be <= replicas.max",
    ),
    (
        "unknown target",
        {"llmfleet:target": "gcp"},
        "llmfleet:target",
        "'local', 'kubernetes' or 'aws'",
    ),
    (
        "unknown instance type",
        {"llmfleet:gpuNodeGroups.0.instanceType": "p9.huge"},
        "llmfleet:gpuNodeGroups[0].instanceType",
        "p4de.24xlarge",
    ),
    (
        "node group zone outside the stack",
        {"llmfleet:gpuNodeGroups.0.zones": ["us-east-1a", "us-west-2a"]},
        "llmfleet:gpuNodeGroups[0].zones[1]",
        "not one of the stack's zones",
    ),
    (
        "pool on a node group that does not exist",
        {"llmfleet:pools.0.nodeGroup": "h100"},
        "llmfleet:pools[0].nodeGroup",
        "gpuNodeGroups: a100",
    ),
    (
        "model too large for one GPU",
        {
            "llmfleet:pools.0.model": "big/model-70b",
            "llmfleet:pools.0.modelFacts": {
                "parameters": 70e9,
                "layers": 80,
                "hiddenSize": 8192,
                "kvHeads": 8,
                "headDim": 128,
                "vocabSize": 128256,
            },
        },
        "llmfleet:pools[0].engine.tensorParallelSize",
        "the model does not fit",
    ),
    (
        "model not in the catalogue and no facts",
        {"llmfleet:pools.0.model": "someone/unknown-13b"},
        "llmfleet:pools[0].model",
        "add llmfleet:pools[0].modelFacts",
    ),
    (
        "tensor parallel that does not divide the node",
        {"llmfleet:pools.0.engine.tensorParallelSize": 3},
        "llmfleet:pools[0].engine.tensorParallelSize",
        "must divide the node's 8 GPUs",
    ),
    (
        "max model len above the model's context",
        {"llmfleet:pools.0.engine.maxModelLen": 65536},
        "llmfleet:pools[0].engine.maxModelLen",
        "context length 32768",
    ),
    (
        "tenant allowed a model nobody serves",
        {"llmfleet:tenants.0.allowedModels": ["gpt-9"]},
        "llmfleet:tenants[0].allowedModels[0]",
        "served: qwen2.5-7b-instruct",
    ),
    (
        "plain api key instead of a hash",
        {"llmfleet:tenants.1.apiKeyHashes": ["sk-live-abcdef1234567890"]},
        "llmfleet:tenants[1].apiKeyHashes",
        "sha256:<64 hex digits>",
    ),
    (
        "demo key outside the local stack",
        {"llmfleet:tenants.1.apiKeyHashes": [hash_api_key(DEMO_API_KEY)]},
        "llmfleet:tenants[1].apiKeyHashes",
        "local stack only",
    ),
    (
        "tenant without keys",
        {"llmfleet:tenants.0.apiKeysSecret": DELETE},
        "llmfleet:tenants[0].apiKeyHashes",
        "apiKeyHashes or apiKeysSecret",
    ),
    (
        "zone outside the region",
        {"llmfleet:availabilityZones": ["us-east-1a", "eu-west-1b"]},
        "llmfleet:availabilityZones[1]",
        "not in region 'us-east-1'",
    ),
    (
        "a public aws gateway without a certificate",
        {"gateway.tls": DELETE},
        "llmfleet:gateway.tls.certificateArn",
        "plain HTTP would carry API keys in clear text",
    ),
    (
        "a public kubernetes gateway without a TLS secret",
        {"target": "kubernetes", "gateway.tls": DELETE, "images.registry": "registry.local/llmfleet"},
        "llmfleet:gateway.tls.secretName",
        "kubernetes.io/tls Secret",
    ),
    (
        "a TLS secret on aws",
        {"gateway.tls.secretName": "gateway-tls"},
        "llmfleet:gateway.tls.secretName",
        "certificateArn (ACM)",
    ),
    (
        "a certificate that is not an ACM ARN",
        {"gateway.tls.certificateArn": "arn:aws:iam::123456789012:server-certificate/x"},
        "llmfleet:gateway.tls.certificateArn",
        "should match pattern",
    ),
    (
        "redis quotas without a url on target local",
        {"llmfleet:target": "local", "llmfleet:gateway": {"quotaBackend": "redis"}},
        "llmfleet:gateway.redisUrl",
        "redis://",
    ),
    (
        "bad restart window time zone",
        {"llmfleet:pools.0.restartWindow": {"enabled": True, "timezone": "Mars/Olympus"}},
        "llmfleet:pools[0].restartWindow.timezone",
        "IANA time zone",
    ),
    (
        "drain grace shorter than propagation",
        {"llmfleet:pools.0.drain": {"graceSeconds": 12, "propagationSeconds": 10}},
        "llmfleet:pools[0].drain.graceSeconds",
        "must exceed propagationSeconds + 5",
    ),
    (
        "a responses store on a pooling engine",
        {"llmfleet:pools.0.engine.runner": "pooling", "llmfleet:pools.0.engine.responsesStore": True},
        "llmfleet:pools[0].engine.responsesStore",
        "only with engine.runner generate",
    ),
    (
        "no pools",
        {"llmfleet:pools": []},
        "llmfleet:pools",
        "at least 1 item",
    ),
    (
        "missing environment",
        {"llmfleet:environment": DELETE},
        "llmfleet:environment",
        "Field required",
    ),
    (
        "pool name that is not a DNS label",
        {"llmfleet:pools.0.name": "Qwen_7B"},
        "llmfleet:pools[0].name",
        "should match pattern",
    ),
    (
        "unknown routing picker",
        {"llmfleet:gateway": {"routing": {"picker": {"name": "fastest"}}}},
        "llmfleet:gateway.routing.picker.name",
        "registered:",
    ),
    (
        "unknown scaling policy",
        {"llmfleet:autoscaling": {"policy": {"name": "magic"}}},
        "llmfleet:autoscaling.policy.name",
        "registered:",
    ),
    (
        "unknown engine kind",
        {"llmfleet:pools.0.engine.kind": "tgi"},
        "llmfleet:pools[0].engine.kind",
        "registered:",
    ),
    (
        "CPU node group instance type EC2 does not have",
        {"llmfleet:cpuNodeGroup": {"instanceType": "p9x.mega"}},
        "llmfleet:cpuNodeGroup.instanceType",
        "not an EC2 instance type",
    ),
    (
        "CPU node group instance type misspelt",
        {"llmfleet:cpuNodeGroup": {"instanceType": "m6i.xlarg"}},
        "llmfleet:cpuNodeGroup.instanceType",
        "did you mean m6i.xlarge",
    ),
    (
        "gateway drain grace shorter than its propagation delay",
        {"llmfleet:gateway": {"drain": {"graceSeconds": 12, "propagationSeconds": 10}}},
        "llmfleet:gateway.drain.graceSeconds",
        "must exceed propagationSeconds + 5",
    ),
    (
        "unknown actuator",
        {"llmfleet:autoscaling": {"actuator": "gcp"}},
        "llmfleet:autoscaling.actuator",
        "registered:",
    ),
    (
        "unknown routing filter",
        {"llmfleet:gateway": {"routing": {"filters": [{"name": "ready"}, {"name": "helthy"}]}}},
        "llmfleet:gateway.routing.filters[1].name",
        "registered: fresh-metrics, not-ejected, ready, serves-adapter, serves-model",
    ),
    (
        "misspelled routing filter parameter",
        {"llmfleet:gateway": {"routing": {"filters": [{"name": "fresh-metrics", "params": {"maxAge": 2}}]}}},
        "llmfleet:gateway.routing.filters[0].params.maxAge",
        "did you mean 'maxAgeS'? allowed keys: maxAgeS",
    ),
    (
        "routing filter parameter out of range",
        {"llmfleet:gateway": {"routing": {"filters": [{"name": "fresh-metrics", "params": {"maxAgeS": 0}}]}}},
        "llmfleet:gateway.routing.filters[0].params.maxAgeS",
        "greater than 0",
    ),
    (
        "misspelled routing scorer parameter",
        {"llmfleet:gateway": {"routing": {"scorers": [{"name": "prefix-affinity", "params": {"blockChar": 64}}]}}},
        "llmfleet:gateway.routing.scorers[0].params.blockChar",
        "did you mean 'blockChars'?",
    ),
    (
        "parameter of a scorer that takes none",
        {"llmfleet:gateway": {"routing": {"scorers": [{"name": "kv-usage", "params": {"weight": 2}}]}}},
        "llmfleet:gateway.routing.scorers[0].params.weight",
        "allowed keys: none",
    ),
    (
        "old snake_case spelling of a picker parameter",
        {"llmfleet:gateway": {"routing": {"picker": {"name": "p2c", "params": {"load_factor": 1.5}}}}},
        "llmfleet:gateway.routing.picker.params.load_factor",
        "keys are camelCase: use 'loadFactor'",
    ),
    (
        "picker parameter out of range",
        {"llmfleet:gateway": {"routing": {"picker": {"name": "p2c", "params": {"loadFactor": 0.5}}}}},
        "llmfleet:gateway.routing.picker.params.loadFactor",
        "greater than or equal to 1",
    ),
    (
        "misspelled scaling policy parameter",
        {"llmfleet:autoscaling": {"policy": {"name": "threshold", "params": {"idleFraktion": 0.1}}}},
        "llmfleet:autoscaling.policy.params.idleFraktion",
        "did you mean 'idleFraction'?",
    ),
    (
        "scaling policy parameter of another policy",
        {"llmfleet:autoscaling": {"policy": {"name": "target-tracking", "params": {"threshold": 3}}}},
        "llmfleet:autoscaling.policy.params.threshold",
        "allowed keys: releaseTimeConstantS, sustainQuantile, sustainWindowS, targetKvUsage, targetQueuePerReplica, "
        "targetUtilisation",
    ),
]


@pytest.mark.parametrize(("case", "overrides", "path", "allowed"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_stack_names_the_key_and_what_is_allowed(
    case: str, overrides: dict[str, Any], path: str, allowed: str
) -> None:
    del case  # Unused: the id names the case.
    with pytest.raises(SpecError) as caught:
        parse_spec(stack_document("aws", **overrides), file="stacks/Pulumi.broken.yaml", registries=all_registries())
    problems = caught.value.problems
    matching = [p for p in problems if p.path == path]
    assert matching, f"no problem at {path}; got {[p.render() for p in problems]}"
    assert any(allowed in p.message for p in matching), [p.message for p in matching]
    assert "stacks/Pulumi.broken.yaml" in str(caught.value)


def test_several_errors_are_reported_together() -> None:
    broken = stack_document(
        "aws",
        **{
            "llmfleet:pools.0.engine.gpuMemoryUtilization": 2.0,
            "llmfleet:pools.0.engine.maxNumSeq": 1,
            "llmfleet:target": "gcp",
        },
    )
    with pytest.raises(SpecError) as caught:
        parse_spec(broken, file="x.yaml")
    assert len(caught.value.problems) == 3


def test_kv_budget_overflow_is_a_warning_with_the_concurrency_that_fits() -> None:
    loaded = parse_spec(
        stack_document(
            "aws",
            **{
                "llmfleet:pools.0.engine.maxModelLen": 32768,
                "llmfleet:pools.0.engine.maxNumSeqs": 1024,
                "llmfleet:pools.0.workload": {"meanPromptTokens": 6000, "meanOutputTokens": 2000},
            },
        )
    )
    [warning] = [w for w in loaded.warnings if w.path == "llmfleet:pools[0].engine.maxNumSeqs"]
    assert "about 129 fit" in warning.message


def test_stack_file_on_disk_reports_its_path(tmp_path: Path) -> None:
    path = write_stack(tmp_path / "Pulumi.mine.yaml", "aws", **{"llmfleet:pools.0.replicas": {"min": 1, "max": 0}})
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(path) in str(caught.value)
    assert "llmfleet:pools[0].replicas.max" in str(caught.value)


def test_unknown_stack_name_lists_the_stacks() -> None:
    shipped = "dev, local, local-canary, local-pd, local-vllm, local-vllm-pd, prod, prod-long-prompt, prod-two-models, "
    shipped += "staging"
    with pytest.raises(SpecError, match=f"stacks: {shipped}"):
        load_spec("qa")


def test_a_gateway_drain_shorter_than_the_longest_request_is_a_warning() -> None:
    # The preStop at the 120 s aws requires (fleet.spec.validate_timing), against the aws preset's 330 s totalS.
    document = stack_document("aws", **{"gateway.drain": {"graceSeconds": 200, "propagationSeconds": 120}})
    warnings = parse_spec(document, file="x.yaml").warnings
    (warning,) = [w for w in warnings if w.path == "llmfleet:gateway.drain.graceSeconds"]
    assert "in-flight requests get 75 s" in warning.message and "330 s" in warning.message
