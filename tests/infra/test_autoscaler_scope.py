"""The control plane's terminate right reaches only the GPU node groups it resizes, never the CPU group."""

from __future__ import annotations

import json

import pytest

from infra.iam import autoscaler_policy, nodegroup_name
from tests.infra.conftest import stack_run

ARN = "arn:aws:eks:us-east-1:111122223333:nodegroup/llmfleet-prod/nodes-a100-us-east-1a-1a2b3c4/9ec8b9d2-1c2d"


@pytest.mark.parametrize(
    ("arn", "name"),
    [
        (ARN, "nodes-a100-us-east-1a-1a2b3c4"),
        ("arn:aws-cn:eks:cn-north-1:111122223333:nodegroup/c/g/i", "g"),
        ("arn:aws:mock:us-east-1:000000000000:nodegroup/nodes-a100-us-east-1a", "nodes-a100-us-east-1a"),
    ],
)
def test_nodegroup_name_reads_the_name_from_the_arn(arn: str, name: str) -> None:
    assert nodegroup_name(arn) == name


@pytest.mark.parametrize("arn", ["arn:aws:eks:us-east-1:1:cluster/c", "arn:aws:eks:us-east-1:1:nodegroup/c/g"])
def test_nodegroup_name_refuses_other_arns(arn: str) -> None:
    with pytest.raises(ValueError, match="not a node group ARN"):
        nodegroup_name(arn)


def test_terminate_is_scoped_to_the_resized_groups_by_name() -> None:
    (_, terminate) = json.loads(autoscaler_policy([ARN], "llmfleet-prod"))["Statement"]
    assert terminate["Condition"] == {
        "StringEquals": {
            "aws:ResourceTag/eks:cluster-name": "llmfleet-prod",
            "aws:ResourceTag/eks:nodegroup-name": ["nodes-a100-us-east-1a-1a2b3c4"],
        }
    }


def test_the_fleets_autoscaler_may_not_terminate_cpu_nodes() -> None:
    run = stack_run("prod")
    (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.startswith("autoscaler")]
    (_, terminate) = json.loads(policy.props["policy"])["Statement"]
    names = terminate["Condition"]["StringEquals"]["aws:ResourceTag/eks:nodegroup-name"]
    groups = {g.props["nodeGroupName"]: g for g in run.of_type("aws:eks/nodeGroup:NodeGroup")}
    gpu = {n for n, g in groups.items() if g.props["amiType"].endswith("NVIDIA")}
    assert set(names) == gpu and len(gpu) == 3
    assert not set(names) & (set(groups) - gpu)  # the CPU group is out of reach
