"""AWS actuator: GPU nodes follow replicas, against moto's EKS and Auto Scaling servers and a Kubernetes API fake.

Scale-up raises node groups' desired sizes; scale-down never lowers them (the Auto Scaling group would pick any
instance); reclaim cordons and terminates exactly the nodes no engine runs on.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import httpx
import pytest
from aiohttp import web

from control_plane.actuators import ActuatorEnv, build_actuator
from control_plane.actuators.aws import AwsActuator, spread
from control_plane.scaling.decisions import ScaleDown, ScaleUp
from fleet.protocol import contract
from fleet.spec.stack import FleetSpec
from llmfleet.local.status import format_status
from tests.support import stacks

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
CLUSTER = "llmfleet-prod"
NODEGROUPS = {("a100", zone): f"nodes-a100-{zone}-4f2a9c1" for zone in ZONES}  # Pulumi's auto-names
LONG_AGO = "2026-01-01T00:00:00Z"


@dataclass
class Aws:
    eks: Any
    autoscaling: Any
    ec2: Any


def _client(service: str, url: str) -> Any:
    return boto3.client(
        service,
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def aws(moto_url: str) -> Iterator[Aws]:
    clients = Aws(_client("eks", moto_url), _client("autoscaling", moto_url), _client("ec2", moto_url))
    clients.eks.create_cluster(
        name=CLUSTER,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2", "subnet-3"]},
    )
    for name in NODEGROUPS.values():
        clients.eks.create_nodegroup(
            clusterName=CLUSTER,
            nodegroupName=name,
            scalingConfig={"minSize": 1, "maxSize": 2, "desiredSize": 1},
            subnets=["subnet-1"],
            nodeRole="arn:aws:iam::123456789012:role/node",
            instanceTypes=["p4de.24xlarge"],
        )
    yield clients
    for name in NODEGROUPS.values():
        clients.eks.delete_nodegroup(clusterName=CLUSTER, nodegroupName=name)
    clients.eks.delete_cluster(name=CLUSTER)


def desired_sizes(eks: Any) -> list[int]:
    sizes = []
    for name in NODEGROUPS.values():
        described = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)
        sizes.append(described["nodegroup"]["scalingConfig"]["desiredSize"])
    return sizes


def prod_spec() -> FleetSpec:
    return stacks.spec("aws")  # pool qwen-7b on a100 (p4de: 8 GPUs, TP 1 -> 8 replicas a node), 3 zones


@pytest.mark.parametrize(("total", "zones", "expected"), [(5, 3, [2, 2, 1]), (0, 2, [0, 0]), (3, 1, [3])])
def test_spread(total: int, zones: int, expected: list[int]) -> None:
    assert spread(total, zones) == expected


async def test_scale_up_grows_node_groups_and_scale_down_never_shrinks_them(aws: Aws) -> None:
    env = ActuatorEnv("prod", "http://cp", eks_client=aws.eks, scale_pods=False, nodegroups=NODEGROUPS)
    actuator = build_actuator(prod_spec(), env, name="aws", dry_run=False)
    assert isinstance(actuator, AwsActuator)
    await actuator.apply(ScaleUp("qwen-7b", current=3, target=40, reason="queue", at=0.0))
    assert desired_sizes(aws.eks) == [2, 2, 1]  # 5 nodes spread over 3 zones
    await actuator.apply(ScaleUp("qwen-7b", current=40, target=100, reason="queue", at=0.0))
    assert desired_sizes(aws.eks) == [2, 2, 2]  # clamped to each group's maxSize
    updates = len(actuator.updates)
    await actuator.apply(ScaleDown("qwen-7b", current=100, target=3, reason="idle", at=0.0, victims=("x",)))
    # Lowering desiredSize would let the Auto Scaling group terminate a node whose engine is serving.
    assert desired_sizes(aws.eks) == [2, 2, 2]
    assert len(actuator.updates) == updates
    assert actuator.updates[-1] == {
        "nodegroup": NODEGROUPS[("a100", "us-east-1c")],
        "minSize": 1,
        "maxSize": 2,
        "desiredSize": 2,
    }


def test_the_actuator_refuses_a_stack_whose_node_groups_it_was_not_given(aws: Aws) -> None:
    partial = {key: name for key, name in NODEGROUPS.items() if key[1] != "us-east-1b"}
    env = ActuatorEnv("prod", "http://cp", eks_client=aws.eks, scale_pods=False, nodegroups=partial)
    with pytest.raises(ValueError, match=r"node group of a100:us-east-1b \(--nodegroup G:Z=NAME\)"):
        build_actuator(prod_spec(), env, name="aws")


class KubeApi:
    """The API server as the reclaim path sees it: GPU nodes, engine pods, and node patches (recorded)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.pods = nodes, pods
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/api/v1/nodes":
            wanted = request.query["labelSelector"]
            items = [n for n in self.nodes if wanted == f"{contract.LABEL_GPU_GROUP}=a100"]
            return web.json_response({"items": items})
        if request.path == "/api/v1/namespaces/llmfleet/pods":
            assert request.query["labelSelector"] == f"{contract.LABEL_COMPONENT}={contract.COMPONENT_ENGINE}"
            return web.json_response({"items": self.pods})
        if request.path.startswith("/api/v1/nodes/") and request.method == "PATCH":
            assert request.headers["Content-Type"] == "application/merge-patch+json"
            self.patches.append((request.path.rsplit("/", 1)[-1], json.loads(await request.read())))
            return web.json_response({})
        return web.json_response({"kind": "Status", "code": 404}, status=404)


def node(name: str, zone: str, instance: str, created: str = LONG_AGO) -> dict[str, Any]:
    labels = {contract.LABEL_GPU_GROUP: "a100", contract.ZONE_TOPOLOGY_KEY: zone}
    return {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": created},
        "spec": {"providerID": f"aws:///{zone}/{instance}"},
    }


def engine_pod(name: str, node_name: str, pool: str = "qwen-7b") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {contract.LABEL_POOL: pool}},
        "spec": {"nodeName": node_name},
        "status": {"phase": "Running"},
    }


@pytest.fixture
async def kube() -> AsyncIterator[tuple[KubeApi, str]]:
    api = KubeApi([], [])
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield api, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def gpu_instances(aws: Aws, name: str, count: int) -> list[str]:
    """An Auto Scaling group of ``count`` instances in us-east-1a, as a managed node group has."""
    image = aws.ec2.describe_images()["Images"][0]["ImageId"]
    aws.autoscaling.create_launch_configuration(
        LaunchConfigurationName=name, ImageId=image, InstanceType="p4de.24xlarge"
    )
    aws.autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchConfigurationName=name,
        MinSize=1,
        MaxSize=4,
        DesiredCapacity=count,
        AvailabilityZones=["us-east-1a"],
    )
    return sorted(i["InstanceId"] for i in auto_scaling_group(aws, name)["Instances"])


def auto_scaling_group(aws: Aws, name: str) -> dict[str, Any]:
    (group,) = aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return dict(group)


def node_actuator(aws: Aws, client: httpx.AsyncClient) -> AwsActuator:
    """The prod stack's aws actuator scaling nodes only, on moto and the loopback API server behind ``client``."""
    env = ActuatorEnv(
        "prod",
        "http://cp",
        eks_client=aws.eks,
        autoscaling_client=aws.autoscaling,
        kubernetes_client=client,
        scale_pods=False,
        nodegroups=NODEGROUPS,
    )
    actuator = build_actuator(prod_spec(), env, name="aws", dry_run=False)
    assert isinstance(actuator, AwsActuator)
    return actuator


async def test_reclaim_terminates_exactly_the_node_a_drain_emptied(aws: Aws, kube: tuple[KubeApi, str]) -> None:
    api, url = kube
    ids = gpu_instances(aws, "eks-emptied", 4)
    api.nodes = [
        node("busy-1", "us-east-1a", ids[0]),
        node("busy-2", "us-east-1a", ids[1]),
        node("drained", "us-east-1a", ids[2]),
        node("just-joined", "us-east-1a", ids[3], created="2999-01-01T00:00:00Z"),  # its engine is on its way
    ]
    api.pods = [engine_pod("a", "busy-1"), engine_pod("b", "busy-2", pool="other-pool-on-a100")]
    client = httpx.AsyncClient(base_url=url)
    actuator = node_actuator(aws, client)
    await actuator.reconcile(prod_spec().pool("qwen-7b"), target=1)
    assert actuator.terminated == [ids[2]]
    assert api.patches == [("drained", {"spec": {"unschedulable": True}})]  # cordoned before it was terminated
    group = auto_scaling_group(aws, "eks-emptied")
    assert group["DesiredCapacity"] == 3
    assert ids[2] not in {i["InstanceId"] for i in group["Instances"]}
    await actuator.close()
    await client.aclose()


async def test_reclaim_keeps_what_the_target_needs(aws: Aws, kube: tuple[KubeApi, str]) -> None:
    api, url = kube
    ids = gpu_instances(aws, "eks-target", 2)
    api.nodes = [node("idle-1", "us-east-1a", ids[0]), node("idle-2", "us-east-1a", ids[1])]
    client = httpx.AsyncClient(base_url=url)
    actuator = node_actuator(aws, client)
    # 16 replicas at 8 a node want 2 nodes: one in us-east-1a (and one in 1b); both idle nodes but one go.
    await actuator.reconcile(prod_spec().pool("qwen-7b"), target=16)
    assert len(actuator.terminated) == 1
    await client.aclose()


async def test_nodes_grow_a_node_start_ahead_of_the_replicas_that_need_them(aws: Aws) -> None:
    # The decision holds 3 replicas (one node in each zone) but the trend wants room for 30 a node start from
    # now: the zones grow at once, before any replica is launched for them.
    env = ActuatorEnv("prod", "http://cp", eks_client=aws.eks, scale_pods=False, nodegroups=NODEGROUPS)
    actuator = build_actuator(prod_spec(), env, name="aws", dry_run=False)
    assert isinstance(actuator, AwsActuator)
    await actuator.reconcile(prod_spec().pool("qwen-7b"), target=3)
    assert desired_sizes(aws.eks) == [1, 1, 1] and actuator.updates == []
    await actuator.reconcile(prod_spec().pool("qwen-7b"), target=3, nodes_for=30)
    assert desired_sizes(aws.eks) == [2, 1, 1]  # 30 replicas at 8 a node: 4 nodes over 3 zones


async def test_a_node_above_the_minimum_goes_only_once_its_replicas_drained(
    aws: Aws, kube: tuple[KubeApi, str]
) -> None:
    # Scaled down to 8 replicas (one node in us-east-1a): the second node still runs a draining engine (deleted,
    # in its grace period, phase Running), the third is empty. Only the empty one goes; the draining one goes
    # on the first reconcile after its engine has finished.
    api, url = kube
    ids = gpu_instances(aws, "eks-draining", 3)
    api.nodes = [node(f"n{i}", "us-east-1a", ids[i]) for i in range(3)]
    draining = engine_pod("b", "n1")
    draining["metadata"]["deletionTimestamp"] = "2026-06-01T00:00:00Z"
    api.pods = [engine_pod("a", "n0"), draining]
    client = httpx.AsyncClient(base_url=url)
    actuator = node_actuator(aws, client)
    pool = prod_spec().pool("qwen-7b")
    await actuator.reconcile(pool, target=8)
    assert actuator.terminated == [ids[2]]
    api.nodes = api.nodes[:2]
    await actuator.reconcile(pool, target=8)
    assert actuator.terminated == [ids[2]]  # the drain is not over: its node stays paid
    draining["status"]["phase"] = "Succeeded"
    await actuator.reconcile(pool, target=8)
    assert actuator.terminated == [ids[2], ids[1]]
    assert auto_scaling_group(aws, "eks-draining")["DesiredCapacity"] == 1
    await client.aclose()


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_node_it_ordered_is_timed_to_its_first_engine_and_shown_beside_node_cold_start_seconds(
    aws: Aws, kube: tuple[KubeApi, str]
) -> None:
    # 25 replicas at 8 a node want a second node in us-east-1a: the raise is the order. The API server then shows
    # that zone's new node (joined 180 s later, Ready at 200 s) and its engine pod (scheduled at 210 s, its
    # container running at 450 s: a 240 s image pull); the older node was there before the order.
    api, url = kube
    client = httpx.AsyncClient(base_url=url)
    actuator = node_actuator(aws, client)
    pool = prod_spec().pool("qwen-7b")
    ordered = time.time()
    await actuator.apply(ScaleUp("qwen-7b", current=3, target=25, reason="queue", at=0.0))
    assert desired_sizes(aws.eks) == [2, 1, 1]
    fresh = node("fresh", "us-east-1a", "i-0fresh", created=_stamp(ordered + 180))
    fresh["status"] = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _stamp(ordered + 200)}]}
    api.nodes = [node("old", "us-east-1a", "i-0old"), fresh]
    pod = engine_pod("e", "fresh")
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp(ordered + 210)}
    ]
    api.pods = [pod]
    await actuator.reconcile(pool, target=25)
    assert actuator.measured_node_starts(pool) is None  # its container is not running yet
    running = {"running": {"startedAt": _stamp(ordered + 450)}}
    pod["status"]["containerStatuses"] = [{"name": "engine", "state": running}]
    await actuator.reconcile(pool, target=25)
    measured = actuator.measured_node_starts(pool)
    assert measured is not None and measured.count == 1 and measured.node_cold_start_s == 600
    last = measured.last
    assert last.node == "fresh" and last.zone == "us-east-1a" and last.pull_s == 240
    # The stamps are whole seconds and the actuator's order comes a few milliseconds after `ordered`: each measure
    # lies within a second (less those milliseconds) below its stamped offset.
    assert 198.5 < last.ready_s <= 200 and 438.5 < last.start_s <= 440
    status = format_status({"pools": [{
        "pool": "qwen-7b", "model": "m", "replicas": 25, "ready": 25, "stale": 0, "min": 3, "max": 24,
        "replica_list": [], "decisions": [], "node_starts": measured.model_dump(),
    }]})  # fmt: skip
    took = f"{last.start_s:.0f}s"
    line = f"node starts (a100): median {took}, longest {took} over 1 (nodeColdStartSeconds 600s)"
    assert line in status and "image pull 240s" in status, status
    await client.aclose()
