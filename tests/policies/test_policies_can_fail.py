"""Every policy of the pack trips on a real program run: a shipped stack with a stack-file change, or, where the
program hard-codes what the policy checks, the recorded graph edited the way that program change would."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from fleet.protocol import contract
from infra.offline import RecordedResource
from infra.stack_run import offline_run
from policies.pack import POLICIES
from policies.runner import evaluate
from tests.policies.conftest import stack_run
from tests.policies.pd_graph import MISSING as BY_PD_EDIT  # the EFA rules: edits of a P/D stack's graph
from tests.support.stacks import stack_document

Graph = list[RecordedResource]


def _edit(type_token: str, change: Callable[[dict[str, Any]], Any], when: Callable[[dict[str, Any]], bool]) -> Any:
    """A graph edit: ``change`` the props of each resource of ``type_token`` that ``when`` selects."""

    def apply(graph: Graph) -> Graph:
        out = []
        for resource in graph:
            if resource.type == type_token and when(resource.props):
                props = copy.deepcopy(resource.props)
                change(props)
                resource = dataclasses.replace(resource, props=props)
            out.append(resource)
        return out

    return apply


def _undepend(type_token: str, when: Callable[[dict[str, Any]], bool], on: str) -> Any:
    """A graph edit: each resource of ``type_token`` that ``when`` selects stops waiting for the resources named
    ``on`` (its own dependencies and its parent component's)."""

    def apply(graph: Graph) -> Graph:
        names = {r.urn: r.name for r in graph}
        chosen = {r.urn for r in graph if r.type == type_token and when(r.props)}
        parents = {r.parent for r in graph if r.urn in chosen}
        out = []
        for resource in graph:
            if resource.urn in chosen or resource.urn in parents:
                kept = tuple(d for d in resource.dependencies if names.get(d) != on)
                resource = dataclasses.replace(resource, dependencies=kept)
            out.append(resource)
        return out

    return apply


def _drop(type_token: str, when: Callable[[dict[str, Any]], bool] = lambda p: True) -> Any:
    return lambda graph: [r for r in graph if not (r.type == type_token and when(r.props))]


def _component(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda p: p.get("metadata", {}).get("labels", {}).get(contract.LABEL_COMPONENT) == name


def _engine_container(props: dict[str, Any]) -> dict[str, Any]:
    return dict(props["spec"]["template"]["spec"]["containers"][0])


def _set_engine(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(props: dict[str, Any]) -> None:
        props["spec"]["template"]["spec"]["containers"][0][key] = value

    return change


def _set_arg(flag: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(props: dict[str, Any]) -> None:
        args = props["spec"]["template"]["spec"]["containers"][0]["args"]
        args[args.index(flag) + 1] = value

    return change


DEPLOYMENT = "kubernetes:apps/v1:Deployment"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
OLD_KEY_ENV = {"name": "LLMFLEET_ENGINE_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "api-key"}}}
SERVICE = "kubernetes:core/v1:Service"
RELEASE = "kubernetes:helm.sh/v3:Release"
ENGINE = _component(contract.COMPONENT_ENGINE)
GATEWAY = _component(contract.COMPONENT_GATEWAY)


def _lb_controller_fails_closed(props: dict[str, Any]) -> None:
    props["values"]["serviceMutatorWebhookConfig"] = {"failurePolicy": "Fail"}


def _both(*edits: Callable[[Graph], Graph]) -> Callable[[Graph], Graph]:
    def apply(graph: Graph) -> Graph:
        for edit in edits:
            graph = edit(graph)
        return graph

    return apply


# Policies a stack file can trip: policy -> (stack, overrides of that stack file).
BY_STACK: dict[str, tuple[str, dict[str, Any]]] = {
    "gpu-capacity-spans-zones": ("prod", {"availabilityZones": ["us-east-1a"]}),
    "gpu-nodes-can-scale": ("prod", {"autoscaling.actuator": "kubernetes"}),
    "pools-spread-across-zones": ("dev", {"environment": "prod"}),  # kubernetes target: a soft spread
    "gpu-memory-headroom": ("prod", {"pools.0.engine.gpuMemoryUtilization": 0.97}),
    "prod-min-replicas": ("prod", {"pools.0.replicas": {"min": 1, "max": 8}}),
    "prod-capacity-buffer": ("prod", {"pools.0.workload.capacityBuffer": 0.1}),
    "allowed-instance-types": ("prod", {"cpuNodeGroup.instanceType": "m5.xlarge"}),
    "monthly-cost-ceiling": ("prod", {"cost.monthlyCeilingUsd": 80_000}),  # prod's GPUs at max: $120,218
    "paid-gpu-utilisation": ("prod", {}),  # prod as shipped: 6 of its 24 paid GPUs used at peak
    "cluster-endpoint-restricted": ("staging", {"cluster.publicEndpointCidrs": ["0.0.0.0/0"]}),
}

# Policies that check what the program hard-codes: policy -> (the program change, that change on prod's graph).
BY_PROGRAM_EDIT: dict[str, tuple[str, Callable[[Graph], Graph]]] = {
    "gpu-requests-match-tensor-parallel": (
        "infra/pools.py `_resources` requests one GPU less than the tensor parallel size",
        _edit(DEPLOYMENT, _set_engine("resources", {"limits": {contract.GPU_RESOURCE: "0"}}), ENGINE),
    ),
    "engine-has-pdb": (
        "infra/pools.py stops creating the PodDisruptionBudget",
        _drop("kubernetes:policy/v1:PodDisruptionBudget", ENGINE),
    ),
    "engine-has-probes": (
        "infra/pools.py drops the startup probe",
        _edit(DEPLOYMENT, _set_engine("startupProbe", None), ENGINE),
    ),
    "engine-grace-covers-drain": (
        "infra/pools.py adds a preStop sleep on top of the agent's propagation wait",
        _edit(DEPLOYMENT, _set_engine("lifecycle", {"preStop": {"sleep": {"seconds": 30}}}), ENGINE),
    ),
    "engines-run-as-non-root": (
        "infra/pools.py brings back the root init container that chowned the cache",
        _edit(
            DEPLOYMENT,
            lambda p: p["spec"]["template"]["spec"].update(
                initContainers=[{"name": "model-cache", "securityContext": {"runAsUser": 0}}]
            ),
            ENGINE,
        ),
    ),
    "only-gateway-public": (
        "infra/pools.py makes the engine Service a LoadBalancer",
        _edit("kubernetes:core/v1:Service", lambda p: p["spec"].update(type="LoadBalancer"), ENGINE),
    ),
    "network-default-deny": (
        "infra/network_policies.py drops the default-deny policy",
        _drop("kubernetes:networking.k8s.io/v1:NetworkPolicy", lambda p: p["spec"]["podSelector"] == {}),
    ),
    "public-listener-tls": (
        "infra/gateway_tier.py drops the NLB's TLS certificate annotation",
        _edit(
            "kubernetes:core/v1:Service",
            lambda p: (
                p["metadata"]["annotations"].update({contract.ANN_TLS: "none"})
                or [p["metadata"]["annotations"].pop(k) for k in list(p["metadata"]["annotations"]) if "ssl" in k]
            ),
            _component(contract.COMPONENT_GATEWAY),
        ),
    ),
    "buckets-encrypted": (
        "infra/storage.py stops configuring server-side encryption",
        _drop(
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        ),
    ),
    "volumes-encrypted": (
        "infra/nodegroups.py stops encrypting the root volume",
        _edit(
            "aws:ec2/launchTemplate:LaunchTemplate",
            lambda p: p["blockDeviceMappings"][0]["ebs"].update(encrypted="false"),
            lambda p: True,
        ),
    ),
    "cluster-secrets-encrypted": (
        "infra/cluster.py drops the secrets encryption config",
        _edit("aws:eks/cluster:Cluster", lambda p: p.pop("encryptionConfig"), lambda p: True),
    ),
    "imds-hop-limit-one": (
        "infra/nodegroups.py sets the IMDS hop limit back to 2",
        _edit(
            "aws:ec2/launchTemplate:LaunchTemplate",
            lambda p: p["metadataOptions"].update(httpPutResponseHopLimit=2),
            lambda p: True,
        ),
    ),
    "images-pinned-by-digest": (
        "infra/images.py references images by tag",
        _edit(DEPLOYMENT, _set_engine("image", "vllm/vllm-openai:latest"), ENGINE),
    ),
    "images-from-stack-registries": (
        "infra/images.py pulls the engine from a public registry",
        _edit(DEPLOYMENT, _set_engine("image", "docker.io/vllm/vllm-openai@sha256:" + "1" * 64), ENGINE),
    ),
    "cluster-prerequisites-installed": (
        "infra/program.py stops installing the Prometheus Operator CRDs",
        _drop("kubernetes:helm.sh/v3:Release", lambda p: "prometheus-operator-crds" in str(p.get("chart"))),
    ),
    "namespaces-created-first": (
        "infra/dashboards/configmaps.py stops creating the Prometheus namespace (`monitoring`) on aws",
        _drop("kubernetes:core/v1:Namespace", lambda p: p["metadata"]["name"] == "monitoring"),
    ),
    "services-wait-for-lb-controller": (
        "infra/lb_controller.py keeps the chart's fail-closed Service webhook and infra/program.py creates the "
        "engine Service without waiting for the controller",
        _both(
            _edit(RELEASE, _lb_controller_fails_closed, lambda p: p.get("chart") == "aws-load-balancer-controller"),
            _undepend(SERVICE, ENGINE, "lb-controller-release"),
        ),
    ),
    "custom-resources-after-crds": (
        "infra/observability.py stops waiting for the Prometheus Operator CRDs' release",
        _undepend("kubernetes:monitoring.coreos.com/v1:PrometheusRule", lambda p: True, "prometheus-crds-release"),
    ),
    "slow-starts-awaited": (
        "infra/pools.py drops the engine Deployment's progress deadline (Kubernetes' default is 600 s)",
        _edit(DEPLOYMENT, lambda p: p["spec"].pop("progressDeadlineSeconds"), ENGINE),
    ),
    "request-timeout-fits-listener": (
        "infra/gateway_tier.py lets a request run 600 s behind the NLB's TLS listener",
        _edit(SERVICE, lambda p: p["metadata"]["annotations"].update({contract.ANN_REQUEST_TIMEOUT: "600"}), GATEWAY),
    ),
    "gateway-drain-covers-deregistration": (
        "infra/gateway_tier.py lets the gateway keep listening 10 s after SIGTERM",
        _edit(DEPLOYMENT, _set_arg("--drain-propagation", "10"), GATEWAY),
    ),
    "engine-grace-covers-longest-request": (
        "infra/pools.py gives in-flight requests 105 s (the old 120 s grace) while the gateway allows 330 s",
        _edit(
            DEPLOYMENT, lambda p: p["metadata"]["annotations"].update({contract.ANN_SHUTDOWN_TIMEOUT: "105"}), ENGINE
        ),
    ),
    "api-token-only-where-used": (
        "infra/device_plugin.py mounts the default account's API token again (the plugin calls no API)",
        _edit(DAEMONSET, lambda p: p["spec"]["template"]["spec"].pop("automountServiceAccountToken"), lambda p: True),
    ),
    "secrets-mounted-as-files": (
        "infra/pools.py takes the engines' API key from its Secret through env again (secretKeyRef)",
        _edit(DEPLOYMENT, _set_engine("env", [OLD_KEY_ENV]), ENGINE),
    ),
    "engines-and-gateways-read-only-root": (
        "infra/pools.py runs the engine on a writable root file system again",
        _edit(DEPLOYMENT, _set_engine("securityContext", {"readOnlyRootFilesystem": False}), ENGINE),
    ),
}


def _old_hardening(graph: Graph) -> Graph:
    """Prod's graph with the settings of before the hardening: the engine's key and the gateway's key and Redis URL
    from env, the engine's root writable, the device plugin's token mounted, the gateway's account mounting its
    token (its pod setting none)."""
    redis_env = {"name": contract.REDIS_URL_ENV, "valueFrom": {"secretKeyRef": {"name": "r", "key": "url"}}}
    for edit in (
        BY_PROGRAM_EDIT["api-token-only-where-used"][1],
        BY_PROGRAM_EDIT["secrets-mounted-as-files"][1],
        BY_PROGRAM_EDIT["engines-and-gateways-read-only-root"][1],
        _edit(DEPLOYMENT, _set_engine("env", [OLD_KEY_ENV, redis_env]), GATEWAY),
        _edit(DEPLOYMENT, lambda p: p["spec"]["template"]["spec"].pop("automountServiceAccountToken"), GATEWAY),
        _edit(
            "kubernetes:core/v1:ServiceAccount",
            lambda p: p.update(automountServiceAccountToken=True),
            lambda p: p["metadata"]["name"] == contract.GATEWAY_NAME,
        ),
    ):
        graph = edit(graph)
    return graph


def test_the_hardening_policies_fail_the_old_settings_and_pass_the_shipped_graph() -> None:
    hardening = ("api-token-only-where-used", "secrets-mounted-as-files", "engines-and-gateways-read-only-root")
    shipped = stack_run("prod").resources
    assert [v for v in evaluate(shipped, POLICIES) if v.policy in hardening] == []
    found = sorted((v.policy, v.resource) for v in evaluate(_old_hardening(shipped), POLICIES) if v.policy in hardening)
    assert found == [
        ("api-token-only-where-used", "gateway-deployment"),
        ("api-token-only-where-used", "nvidia-daemonset"),
        ("engines-and-gateways-read-only-root", "pool-qwen-7b-deployment"),
        ("secrets-mounted-as-files", "gateway-deployment"),
        ("secrets-mounted-as-files", "pool-qwen-7b-deployment"),
    ]


def test_every_policy_has_a_way_to_trip_it_from_a_stack_or_the_program() -> None:
    assert set(BY_STACK) | set(BY_PROGRAM_EDIT) | set(BY_PD_EDIT) == {p.name for p in POLICIES}
    assert not set(BY_STACK) & set(BY_PROGRAM_EDIT) and not (set(BY_STACK) | set(BY_PROGRAM_EDIT)) & set(BY_PD_EDIT)


@pytest.mark.parametrize("name", sorted(BY_STACK))
def test_a_stack_file_change_trips_the_policy(name: str) -> None:
    stack, overrides = BY_STACK[name]
    run = offline_run(stack_document(stack, **overrides), stack)
    assert name in {v.policy for v in evaluate(run.resources, POLICIES)}


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpuNodeGroups.0.maxNodesPerAz": 6},
        # Capacity blocks name their instance type on the launch template only: still counted, at max size.
        {"gpuNodeGroups.0.capacityType": "capacity-block", "gpuNodeGroups.0.maxNodesPerAz": 6},
    ],
)
def test_gpu_groups_growing_past_the_stacks_ceiling_trip_the_cost_policy(overrides: dict[str, Any]) -> None:
    run = offline_run(stack_document("prod", **overrides), "prod")
    violations = evaluate([r for r in run.resources if r.custom], POLICIES)
    # 3 zones x 6 p4de at the catalogue's $27.44705 an hour on demand.
    assert [v.policy for v in violations if "$360,654/month" in v.message] == ["monthly-cost-ceiling"]


@pytest.mark.parametrize("name", sorted(BY_PROGRAM_EDIT))
def test_a_program_change_trips_the_policy(name: str) -> None:
    _, edit = BY_PROGRAM_EDIT[name]
    graph = edit(list(stack_run("prod").resources))  # components too: ordering follows parents
    assert graph != stack_run("prod").resources  # the edit changed something
    assert name in {v.policy for v in evaluate(graph, POLICIES)}
    assert name not in {v.policy for v in evaluate(stack_run("prod").resources, POLICIES)}
