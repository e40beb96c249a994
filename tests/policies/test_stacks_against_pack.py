"""The program under mocks against the whole pack: shipped stacks pass, a broken prod fails as it should."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from fleet.protocol import contract
from fleet.spec.loader import list_stacks, load_spec
from infra.offline import OfflineRun, RecordedResource
from infra.stack_run import offline_run
from llmfleet.cli import main
from policies.pack import POLICIES
from policies.runner import evaluate
from tests.policies.conftest import stack_run
from tests.support.stacks import stack_document, write_stack

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]

# Advisories the shipped stacks carry on purpose: one small pool on 8-GPU p4de nodes per zone leaves most paid
# GPUs idle, and the catalogue has no A100 instance type with fewer GPUs (docs/cloud.md, "Paid capacity").
# prod-long-prompt's P/D pool (decode and prefill replicas on one p4de group) passes the EFA rules and carries the same.
SHIPPED_ADVISORIES = {s: ["paid-gpu-utilisation"] for s in ("prod", "prod-two-models", "prod-long-prompt", "staging")}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_shipped_stack_passes_the_pack_with_only_its_known_advisories(stack: str) -> None:
    run = stack_run(stack)
    violations = evaluate(run.resources, POLICIES)  # components too: the first-up rules follow parents
    assert not [v for v in violations if v.mandatory]
    assert sorted(v.policy for v in violations) == SHIPPED_ADVISORIES.get(stack, [])


def _one_zone_prod() -> OfflineRun:
    return offline_run(stack_document("prod", availabilityZones=["us-east-1a"]), "prod")


def _break(run: OfflineRun) -> list[RecordedResource]:
    """What a bad change to the program would produce: no engine PDB, the engine Service made public."""
    broken: list[RecordedResource] = []
    for resource in run.resources:
        labels = resource.props.get("metadata", {}).get("labels", {})
        is_engine = labels.get(contract.LABEL_COMPONENT) == contract.COMPONENT_ENGINE
        if resource.type == "kubernetes:policy/v1:PodDisruptionBudget" and is_engine:
            continue
        if resource.type == "kubernetes:core/v1:Service" and is_engine:
            props = copy.deepcopy(resource.props)
            props["spec"] = {**props["spec"], "type": "LoadBalancer"}
            props["spec"].pop("clusterIP")
            resource = dataclasses.replace(resource, props=props)
        broken.append(resource)
    return broken


def test_broken_prod_fails_with_exactly_the_named_violations() -> None:
    violations = evaluate(_break(_one_zone_prod()), POLICIES)
    assert sorted((v.policy, v.resource) for v in violations) == [
        ("engine-has-pdb", "pool-qwen-7b-deployment"),
        ("gpu-capacity-spans-zones", "nodes-a100-us-east-1a"),
        ("only-gateway-public", "pool-qwen-7b-service"),
        ("public-listener-tls", "pool-qwen-7b-service"),  # and in clear text at that
    ]
    assert all(v.mandatory for v in violations)


def test_cli_passes_a_shipped_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    assert "0 mandatory, 1 advisory" in out and "paid-gpu-utilisation" in out


def test_cli_reports_a_local_stack_has_nothing_to_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", "--stack", "local"]) == 0
    assert "no cloud resources to check" in capsys.readouterr().out


def test_cli_file_override_fails_on_mandatory_violations_with_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack_file = write_stack(
        tmp_path / "Pulumi.prod.yaml",
        "prod",
        availabilityZones=["us-east-1a"],
        **{"pools.0.replicas": {"min": 1, "max": 8}, "pools.0.workload.capacityBuffer": 0.1},
    )
    assert main(["policy", "check", "--stack", "prod", "--file", str(stack_file)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = [line for line in lines if line.startswith("LEVEL")][0]
    assert header.split() == ["LEVEL", "POLICY", "RESOURCE", "MESSAGE"]
    assert "gpu-capacity-spans-zones" in out and "prod-min-replicas" in out and "prod-capacity-buffer" in out
    assert "2 mandatory, 2 advisory violation(s)" in out  # prod-capacity-buffer, paid-gpu-utilisation


def test_cli_advisory_only_exits_zero_and_policy_config_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack_file = write_stack(tmp_path / "Pulumi.prod.yaml", "prod", **{"pools.0.workload.capacityBuffer": 0.1})
    assert main(["policy", "check", "--stack", "prod", "--file", str(stack_file)]) == 0
    assert "0 mandatory, 2 advisory" in capsys.readouterr().out  # prod-capacity-buffer, paid-gpu-utilisation

    config = tmp_path / "policy-config.json"
    config.write_text(json.dumps({"monthly-cost-ceiling": {"monthlyCeilingUsd": {"prod": 10_000}}}))
    assert main(["policy", "check", "--stack", "prod", "--policy-config", str(config), "--json"]) == 1
    violations = json.loads(capsys.readouterr().out)
    assert sorted((v["policy"], v["level"]) for v in violations) == [
        ("monthly-cost-ceiling", "mandatory"),
        ("paid-gpu-utilisation", "advisory"),
    ]


def test_cli_invalid_stack_file_lists_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack_file = write_stack(tmp_path / "Pulumi.prod.yaml", "prod", **{"pools.0.engine.gpuMemoryUtilization": 1.5})
    assert main(["policy", "check", "--stack", "prod", "--file", str(stack_file)]) == 1
    assert "llmfleet:pools[0].engine.gpuMemoryUtilization" in capsys.readouterr().err
