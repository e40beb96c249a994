"""AWS actuator: GPU node groups follow replicas, against moto's EKS server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from autoscaler.actuators import ActuatorEnv, build_actuator
from autoscaler.actuators.aws import AwsActuator, spread
from autoscaler.decisions import ScaleDown, ScaleUp
from fleet.ports import free_port
from tests.support import stacks

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]


@pytest.fixture(scope="module")
def eks() -> Iterator[Any]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "eks",
        region_name="us-east-1",
        endpoint_url=f"http://{host}:{port}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_cluster(
        name="llmfleet-prod",
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2", "subnet-3"]},
    )
    for zone in ZONES:
        client.create_nodegroup(
            clusterName="llmfleet-prod",
            nodegroupName=f"nodes-a100-{zone}-4f2a9c1",  # Pulumi auto-names: found by tags
            tags={"llmfleet.io/gpu-group": "a100", "llmfleet.io/zone": zone},
            scalingConfig={"minSize": 1, "maxSize": 2, "desiredSize": 1},
            subnets=["subnet-1"],
            nodeRole="arn:aws:iam::123456789012:role/node",
            instanceTypes=["p4de.24xlarge"],
        )
    yield client
    server.stop()


def desired_sizes(eks: Any) -> list[int]:
    return [
        eks.describe_nodegroup(clusterName="llmfleet-prod", nodegroupName=f"nodes-a100-{z}-4f2a9c1")["nodegroup"][
            "scalingConfig"
        ]["desiredSize"]
        for z in ZONES
    ]


@pytest.mark.parametrize(("total", "zones", "expected"), [(5, 3, [2, 2, 1]), (0, 2, [0, 0]), (3, 1, [3])])
def test_spread(total: int, zones: int, expected: list[int]) -> None:
    assert spread(total, zones) == expected


async def test_node_groups_follow_replicas_on_moto(eks: Any) -> None:
    spec = stacks.spec("aws")  # pool on a100 (p4de: 8 GPUs, TP 1 -> 8 replicas a node)
    actuator = build_actuator(spec, ActuatorEnv("prod", "http://cp", eks_client=eks, scale_pods=False), name="aws")
    assert isinstance(actuator, AwsActuator)
    await actuator.apply(ScaleUp("qwen-7b", current=3, target=40, reason="queue", at=0.0))
    assert desired_sizes(eks) == [2, 2, 1]  # 5 nodes spread over 3 zones
    await actuator.apply(ScaleUp("qwen-7b", current=40, target=100, reason="queue", at=0.0))
    assert desired_sizes(eks) == [2, 2, 2]  # clamped to each group's maxSize
    await actuator.apply(ScaleDown("qwen-7b", current=100, target=3, reason="idle", at=0.0, victims=("x",)))
    assert desired_sizes(eks) == [1, 1, 1]  # never below minSize
    assert actuator.updates[-1] == {
        "nodegroup": "nodes-a100-us-east-1c-4f2a9c1",
        "minSize": 1,
        "maxSize": 2,
        "desiredSize": 1,
    }
