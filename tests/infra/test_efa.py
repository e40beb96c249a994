"""P/D pools on the program's graph: the prefill role pool deployed like any pool, and EFA on aws (`infra.efa`,
`infra.efa_cloud`): the device plugin, the security group, the interfaces, the placement group and the pods' part."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from fleet.capacity.disagg import EFA_GBPS_PER_NODE
from fleet.protocol import contract
from infra.dashboards.pool import pool_dashboard
from infra.efa import EFA_DEVICES, EFA_ENV, EFA_NODE_LABEL, EFA_RESOURCE, SIDE_CHANNEL_HOST_ENV, efa_per_replica
from infra.efa_cloud import EFA_CHART, EFA_CHART_VERSION
from infra.offline import OfflineRun, RecordedResource
from infra.stack_run import offline_run
from tests.infra.conftest import stack_run
from tests.support.stacks import spec, stack_document

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"
RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
PD = {"prefill": {"replicas": {"min": 2, "max": 4}}, "backends": ["LIBFABRIC"]}


@functools.cache
def pd_run(instance: str = "p4de.24xlarge") -> OfflineRun:
    overrides = {"pools.0.disaggregation": PD, "gpuNodeGroups.0.instanceType": instance}
    return offline_run(stack_document("aws", **overrides), "prod")


def _container(deployment: RecordedResource) -> dict[str, Any]:
    return dict(deployment.props["spec"]["template"]["spec"]["containers"][0])


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _efa_rules(run: OfflineRun, type_token: str) -> list[RecordedResource]:
    return [r for r in run.of_type(type_token) if r.name.startswith("nodes-efa")]


def _pool_deployments(run: OfflineRun) -> dict[str, RecordedResource]:
    return {r.props["metadata"]["name"]: r for r in run.of_type(DEPLOYMENT) if r.name.startswith("pool-")}


def test_the_prefill_role_pool_gets_its_own_deployment_service_and_pdb_with_the_same_image_and_model() -> None:
    run = pd_run()
    deployments = _pool_deployments(run)
    assert sorted(deployments) == ["llmfleet-qwen-7b", "llmfleet-qwen-7b-prefill"]
    decode, prefill = (_container(deployments[n]) for n in ("llmfleet-qwen-7b", "llmfleet-qwen-7b-prefill"))
    assert decode["image"] == prefill["image"]
    # The agent reads the pool (model, engine, role) from the stack file by name.
    assert prefill["args"][prefill["args"].index("--pool") + 1] == "qwen-7b-prefill"
    assert deployments["llmfleet-qwen-7b-prefill"].props["spec"]["replicas"] == 2  # prefill.replicas.min
    for kind in (SERVICE, PDB):
        assert "llmfleet-qwen-7b-prefill" in {r.props["metadata"]["name"] for r in run.of_type(kind)}


def test_pd_pods_request_their_gpus_share_of_efa_lock_memory_and_name_their_side_channel_host() -> None:
    for container in map(_container, _pool_deployments(pd_run()).values()):
        resources = container["resources"]
        assert resources["requests"][EFA_RESOURCE] == resources["limits"][EFA_RESOURCE] == "1"  # TP1 on p4de
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        env = _env(container)
        assert env[SIDE_CHANNEL_HOST_ENV] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert (
            {k: env[k] for k in EFA_ENV}
            == EFA_ENV
            == {
                "FI_PROVIDER": "efa",
                "FI_EFA_USE_DEVICE_RDMA": "1",
                "FI_EFA_ENABLE_SHM_TRANSFER": "0",
                "FI_EFA_ENABLE_SHM": "0",
            }
        )


def test_the_efa_device_plugin_tolerates_the_gpu_taint_and_runs_on_efa_gpu_nodes_only() -> None:
    (release,) = [r for r in pd_run().of_type(RELEASE) if r.props["chart"] == EFA_CHART]
    assert release.props["version"] == EFA_CHART_VERSION
    assert release.props["namespace"] == "kube-system"
    assert release.props["repositoryOpts"] == {"repo": "https://aws.github.io/eks-charts"}
    assert release.props["values"] == {
        "tolerations": [{"key": contract.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {contract.LABEL_NODE_ROLE: "gpu", EFA_NODE_LABEL: "true"},
    }
    gpu_groups = [r for r in pd_run().of_type(NODE_GROUP) if r.props["amiType"].endswith("NVIDIA")]
    for group in gpu_groups:  # the labels the release selects, and the prefill role pool's node selector
        labels = group.props["labels"]
        assert labels[EFA_NODE_LABEL] == "true" and labels[contract.LABEL_NODE_ROLE] == "gpu"
        assert labels["pool.llmfleet.io/qwen-7b-prefill"] == "true"


def test_the_efa_security_group_admits_all_traffic_from_and_to_itself() -> None:
    run = pd_run()
    (ingress,), (egress,) = _efa_rules(run, INGRESS), _efa_rules(run, EGRESS)
    for rule in (ingress, egress):
        assert rule.props["ipProtocol"] == "-1"
        assert rule.props["referencedSecurityGroupId"] == rule.props["securityGroupId"] == "nodes-efa-sg-id"


@pytest.mark.parametrize(("instance", "cards"), [("p4de.24xlarge", 4), ("p5.48xlarge", 32)])
def test_efa_launch_templates_carry_one_efa_interface_per_card_and_a_cluster_placement_group(
    instance: str, cards: int
) -> None:
    run = pd_run(instance)
    placement = {r.props["name"]: r.props["strategy"] for r in run.of_type(PLACEMENT_GROUP)}
    assert placement == {f"llmfleet-prod-a100-{zone}": "cluster" for zone in ZONES}
    templates = [r for r in run.of_type(LAUNCH_TEMPLATE) if r.name != "nodes-cpu"]
    assert len(templates) == len(ZONES)
    for template in templates:
        interfaces = template.props["networkInterfaces"]
        assert [(i["networkCardIndex"], i["deviceIndex"]) for i in interfaces] == [(0, 0)] + [
            (card, 1) for card in range(1, cards)
        ]
        assert {i["interfaceType"] for i in interfaces} == {"efa"}
        # The cluster security group too: interfaces that name groups lose the one EKS adds.
        assert all(i["securityGroups"] == ["sg-cluster-eks", "nodes-efa-sg-id"] for i in interfaces)
        zone = template.props["tags"][contract.TAG_ZONE]
        assert template.props["placement"] == {"groupName": f"llmfleet-prod-a100-{zone}"}


def test_a_capacity_block_group_gets_efa_interfaces_but_no_placement_group() -> None:
    overrides = {"pools.0.disaggregation": PD, "gpuNodeGroups.0.capacityType": "capacity-block"}
    run = offline_run(stack_document("aws", **overrides), "prod")
    assert run.of_type(PLACEMENT_GROUP) == []
    templates = [r for r in run.of_type(LAUNCH_TEMPLATE) if r.name != "nodes-cpu"]
    assert all(len(t.props["networkInterfaces"]) == 4 and "placement" not in t.props for t in templates)


def test_a_stack_without_a_pd_pool_gets_none_of_it() -> None:
    run = stack_run("prod")
    assert [r.props.get("chart") for r in run.of_type(RELEASE) if r.props.get("chart") == EFA_CHART] == []
    assert run.of_type(PLACEMENT_GROUP) == _efa_rules(run, INGRESS) == _efa_rules(run, EGRESS) == []
    assert not any("networkInterfaces" in r.props for r in run.of_type(LAUNCH_TEMPLATE))
    for deployment in _pool_deployments(run).values():
        container = _container(deployment)
        assert EFA_RESOURCE not in container["resources"]["limits"] and SIDE_CHANNEL_HOST_ENV not in _env(container)


def test_a_pd_pool_on_the_kubernetes_target_names_its_side_channel_host_but_gets_no_efa() -> None:
    run = offline_run(stack_document("dev", **{"pools.0.disaggregation": {"backends": ["UCX"]}}), "dev")
    deployments = _pool_deployments(run)
    assert len(deployments) == 2 and run.of_type(PLACEMENT_GROUP) == []
    for container in map(_container, deployments.values()):
        assert SIDE_CHANNEL_HOST_ENV in _env(container) and "FI_PROVIDER" not in _env(container)
        assert EFA_RESOURCE not in container["resources"].get("limits", {})


@pytest.mark.parametrize(
    ("instance", "tp", "devices"),
    [
        ("p4de.24xlarge", 1, 1),  # 4 x 1/8 = 0.5: at least one, so a node holds at most 4 such replicas
        ("p4de.24xlarge", 2, 1),
        ("p4de.24xlarge", 4, 2),
        ("p4de.24xlarge", 8, 4),
        ("p5.48xlarge", 1, 4),
        ("p5.48xlarge", 8, 32),
    ],
)
def test_a_replica_takes_its_gpus_share_of_the_nodes_efa_devices(instance: str, tp: int, devices: int) -> None:
    overrides = {
        "pools.0.disaggregation": PD,
        "pools.0.engine.tensorParallelSize": tp,
        "gpuNodeGroups.0.instanceType": instance,
    }
    stack = spec("aws", **overrides)
    assert [efa_per_replica(stack, p) for p in stack.engine_pools] == [devices, devices]
    aggregated = spec("aws", **{"gpuNodeGroups.0.instanceType": instance})
    assert efa_per_replica(aggregated, aggregated.pools[0]) == 0


def test_the_pool_dashboard_lists_the_prefill_role_pool() -> None:
    (pool_variable,) = [
        v
        for v in pool_dashboard(spec("aws", **{"pools.0.disaggregation": PD}))["templating"]["list"]
        if v["name"] == "pool"
    ]
    assert pool_variable["query"] == "qwen-7b,qwen-7b-prefill"


def test_the_instances_given_efa_are_those_validate_and_the_simulator_take_for_efa() -> None:
    # One list in three places: a type here but not in the simulator's link table would be priced over TCP and
    # warned about by `llmfleet validate` while the program gives it EFA (and the reverse fails every EFA policy).
    assert set(EFA_DEVICES) == set(EFA_GBPS_PER_NODE)
