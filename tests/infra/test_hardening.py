"""The hardened cluster under mocks: network isolation, pod security, IMDS, the API endpoint, access and the CNI."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.protocol import contract
from fleet.spec.loader import list_stacks, load_spec
from infra.efa import EFA_RESOURCE
from infra.network_policies import NAMESPACE_NAME_LABEL
from infra.offline import OfflineRun, RecordedResource
from infra.stack_run import offline_run
from policies.network import network_default_deny
from policies.runner import evaluate
from tests.infra.conftest import stack_run
from tests.support.stacks import stack_document

NAMESPACE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]
AWS_STACKS = [s for s in CLOUD_STACKS if load_spec(s).spec.target == "aws"]


def _policies(run: OfflineRun, namespace: str) -> list[RecordedResource]:
    return [r for r in run.of_type(NETWORK_POLICY) if r.props["metadata"]["namespace"] == namespace]


def _selecting(run: OfflineRun, namespace: str, component: str) -> list[dict[str, Any]]:
    """The ingress rules of the policies that select ``component``'s pods."""
    rules: list[dict[str, Any]] = []
    for policy in _policies(run, namespace):
        selector = policy.props["spec"]["podSelector"].get("matchLabels", {})
        if selector.get(contract.LABEL_COMPONENT) == component:
            rules += policy.props["spec"].get("ingress", [])
    return rules


def _peers(rules: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    return [peer for rule in rules if port in {p["port"] for p in rule["ports"]} for peer in rule.get("from", [])]


def _component(component: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {contract.LABEL_COMPONENT: component}}}


# Network isolation.


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_namespace_has_a_default_deny_ingress_policy(stack: str) -> None:
    run = stack_run(stack)
    # The namespaces fleet pods run in (on aws the dashboards' namespace holds ConfigMaps only).
    namespaces = [r.props["metadata"]["name"] for r in run.of_type(NAMESPACE) if _runs_pods(r)]
    assert namespaces
    for namespace in namespaces:
        deny = [p for p in _policies(run, namespace) if p.props["spec"]["podSelector"] == {}]
        assert [p.props["spec"] for p in deny] == [{"podSelector": {}, "policyTypes": ["Ingress"]}]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_engines_admit_only_gateways_the_control_plane_and_the_scraper(stack: str) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    rules = _selecting(run, spec.cluster.namespace, contract.COMPONENT_ENGINE)
    scraper = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}}}
    gateway, control_plane = _component(contract.COMPONENT_GATEWAY), _component(contract.COMPONENT_CONTROL_PLANE)
    assert _peers(rules, contract.ENGINE_PORT) == [gateway, scraper]
    assert _peers(rules, contract.AGENT_PORT) == [gateway, control_plane, scraper]
    # KV-cache events (staging's engines publish them): the gateways' indexes are their only readers.
    events = any(pool.engine.kv_events for pool in spec.pools)
    assert _peers(rules, contract.KV_EVENTS_PORT) == ([gateway] if events else [])
    # NIXL's side channel (prod-long-prompt's P/D pool): decode engines open it on prefill engines.
    side = {p.disaggregation.side_channel_port for p in spec.pools if p.disaggregation is not None}
    assert all(_peers(rules, port) == [_component(contract.COMPONENT_ENGINE)] for port in side)
    ports = {contract.ENGINE_PORT, contract.AGENT_PORT} | ({contract.KV_EVENTS_PORT} if events else set()) | side
    assert {p["port"] for rule in rules for p in rule["ports"]} == ports
    assert evaluate([r for r in run.resources if r.custom], [network_default_deny]) == []


def test_the_scraper_namespace_comes_from_the_stack() -> None:
    run = offline_run(stack_document("dev", **{"observability.prometheusNamespace": "prom"}), "dev")
    rules = _selecting(run, "llmfleet-dev", contract.COMPONENT_ENGINE)
    selectors = [p["namespaceSelector"] for p in _peers(rules, contract.AGENT_PORT) if "namespaceSelector" in p]
    assert selectors == [{"matchLabels": {NAMESPACE_NAME_LABEL: "prom"}}]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_control_plane_admits_agents_gateways_and_the_scraper_and_the_gateway_admits_anyone_but_its_admin_port(
    stack: str,
) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    namespace = spec.cluster.namespace
    scraper = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: spec.observability.prometheus_namespace}}}
    control = _selecting(run, namespace, contract.COMPONENT_CONTROL_PLANE)
    assert _peers(control, spec.control_plane.port) == [
        _component(contract.COMPONENT_ENGINE),
        _component(contract.COMPONENT_GATEWAY),
        scraper,
    ]
    gateway = _selecting(run, namespace, contract.COMPONENT_GATEWAY)
    assert gateway == [
        {"ports": [{"protocol": "TCP", "port": spec.gateway.port}]},  # no `from`: any source
        {"from": [scraper], "ports": [{"protocol": "TCP", "port": spec.gateway.admin_port}]},  # /metrics, /readyz
    ]


def test_in_cluster_quota_redis_admits_only_gateways() -> None:
    run = offline_run(stack_document("dev", **{"gateway.quotaBackend": "redis"}), "dev")
    rules = _selecting(run, "llmfleet-dev", contract.COMPONENT_QUOTA_REDIS)
    assert _peers(rules, 6379) == [_component(contract.COMPONENT_GATEWAY)]
    assert len(rules) == 1


def test_a_stack_without_the_in_cluster_redis_has_no_redis_policy() -> None:
    assert _selecting(stack_run("dev"), "llmfleet-dev", contract.COMPONENT_QUOTA_REDIS) == []


# Nodes and the API endpoint.

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EKS_CLUSTER = "aws:eks/cluster:Cluster"


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_launch_template_requires_imdsv2_with_hop_limit_one(stack: str) -> None:
    templates = stack_run(stack).of_type(LAUNCH_TEMPLATE)
    assert len(templates) > 1  # the CPU group's and one per GPU group and zone
    for template in templates:
        assert template.props["metadataOptions"] == {
            "httpTokens": "required",
            "httpPutResponseHopLimit": 1,
            "httpEndpoint": "enabled",
        }


def test_prod_endpoint_is_private_plus_the_stack_cidrs_never_the_internet() -> None:
    (cluster,) = stack_run("prod").of_type(EKS_CLUSTER)
    vpc = cluster.props["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True
    assert vpc["endpointPublicAccess"] is True
    assert vpc["publicAccessCidrs"] == load_spec("prod").spec.cluster.public_endpoint_cidrs
    assert "0.0.0.0/0" not in vpc["publicAccessCidrs"]


def test_without_public_cidrs_the_endpoint_is_private_only() -> None:
    from tests.support.stacks import DELETE

    run = offline_run(stack_document("prod", **{"cluster.publicEndpointCidrs": DELETE}), "prod")
    (cluster,) = run.of_type(EKS_CLUSTER)
    assert cluster.props["vpcConfig"]["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in cluster.props["vpcConfig"]


# Pod security.


def _workload(run: OfflineRun, component: str) -> list[RecordedResource]:
    return [
        r for r in run.of_type(DEPLOYMENT) if r.props["metadata"]["labels"].get(contract.LABEL_COMPONENT) == component
    ]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_engine_pods_run_as_the_images_non_root_user_without_privileges(stack: str) -> None:
    engines = _workload(stack_run(stack), contract.COMPONENT_ENGINE)
    assert engines
    for deployment in engines:
        pod = deployment.props["spec"]["template"]["spec"]
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert "initContainers" not in pod
        # Pods with EFA devices add IPC_LOCK, as llm-d's AWS overlay (`infra.efa`); no other capability.
        added = ["IPC_LOCK"] if EFA_RESOURCE in pod["containers"][0]["resources"]["limits"] else []
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"], **({"add": added} if added else {})}
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
@pytest.mark.parametrize("component", [contract.COMPONENT_GATEWAY, contract.COMPONENT_CONTROL_PLANE])
def test_gateway_and_control_plane_run_non_root_on_a_read_only_root(stack: str, component: str) -> None:
    (deployment,) = _workload(stack_run(stack), component)
    pod = deployment.props["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


@pytest.mark.parametrize(
    ("stack", "enforce"),
    [("dev", "restricted"), ("prod", "privileged"), ("staging", "privileged")],
)
def test_namespace_enforces_restricted_unless_engines_mount_the_node_cache(stack: str, enforce: str) -> None:
    (namespace,) = [r for r in stack_run(stack).of_type(NAMESPACE) if _runs_pods(r)]
    labels = namespace.props["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == enforce
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    volumes = [v for d in _workload(stack_run(stack), contract.COMPONENT_ENGINE) for v in _volumes(d)]
    assert any("hostPath" in v for v in volumes) is (enforce == "privileged")  # the only reason not to enforce


def _runs_pods(namespace: RecordedResource) -> bool:
    """The fleet's own namespace: the one with Pod Security Admission labels."""
    return "pod-security.kubernetes.io/enforce" in namespace.props["metadata"]["labels"]


def _volumes(deployment: RecordedResource) -> list[dict[str, Any]]:
    return list(deployment.props["spec"]["template"]["spec"]["volumes"])


# Cluster access, control-plane logs and the VPC CNI.

ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_admin_and_ci_role_of_the_stack_is_a_cluster_admin(stack: str) -> None:
    run = stack_run(stack)
    cluster_spec = load_spec(stack).spec.cluster
    wanted = {*cluster_spec.admin_role_arns, *cluster_spec.ci_role_arns}
    assert wanted  # the shipped aws stacks list both kinds
    assert {e.props["principalArn"] for e in run.of_type(ACCESS_ENTRY)} == wanted
    associations = run.of_type(ACCESS_POLICY)
    assert {a.props["principalArn"] for a in associations} == wanted
    for association in associations:
        assert association.props["policyArn"].endswith("/AmazonEKSClusterAdminPolicy")
        assert association.props["accessScope"] == {"type": "cluster"}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_control_plane_logs_go_to_an_encrypted_expiring_group_made_before_the_cluster(stack: str) -> None:
    run = stack_run(stack)
    (cluster,) = run.of_type(EKS_CLUSTER)
    (group,) = run.of_type("aws:cloudwatch/logGroup:LogGroup")
    assert group.props["name"] == f"/aws/eks/{contract.cluster_name(load_spec(stack).spec.environment)}/cluster"
    assert group.props["retentionInDays"] == load_spec(stack).spec.cluster.log_retention_days
    keys = {k.props["arn"]: k for k in run.of_type("aws:kms/key:Key")}
    key_policy = keys[group.props["kmsKeyId"]].props["policy"]
    assert "logs.us-east-1.amazonaws.com" in key_policy and group.props["name"] in key_policy
    assert run.depends_on(cluster, group)


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_the_vpc_cni_runs_on_its_own_role_and_enforces_network_policies(stack: str) -> None:
    import json

    run = stack_run(stack)
    (addon,) = [a for a in run.of_type("aws:eks/addon:Addon") if a.props["addonName"] == "vpc-cni"]
    assert json.loads(addon.props["configurationValues"]) == {"enableNetworkPolicy": "true"}
    (role,) = [r for r in run.of_type("aws:iam/role:Role") if r.props["arn"] == addon.props["serviceAccountRoleArn"]]
    trust = json.loads(role.props["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
    assert "system:serviceaccount:kube-system:aws-node" in trust.values()
    attached = {
        a.props["policyArn"].rsplit("/", 1)[-1]: a.parent
        for a in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert attached["AmazonEKS_CNI_Policy"] == role.urn  # on the CNI's role, on no node role
    for group in run.of_type("aws:eks/nodeGroup:NodeGroup"):
        assert run.depends_on(group, addon) or any(
            run.depends_on(p, addon) for p in run.resources if p.urn == group.parent
        )


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_the_gateways_admin_port_is_probed_and_scraped_but_no_service_exposes_it(stack: str) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    (gateway,) = [d for d in run.of_type(DEPLOYMENT) if d.props["metadata"]["name"] == contract.GATEWAY_NAME]
    (container,) = gateway.props["spec"]["template"]["spec"]["containers"]
    assert {"name": "admin", "containerPort": spec.gateway.admin_port} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": spec.gateway.admin_port,
        "scheme": "HTTP",
    }
    services = [
        s for s in run.of_type("kubernetes:core/v1:Service") if s.props["metadata"]["name"] == contract.GATEWAY_NAME
    ]
    assert services
    for service in services:
        exposed = {p.get("targetPort", p["port"]) for p in service.props["spec"]["ports"]}
        assert spec.gateway.admin_port not in exposed and "admin" not in exposed


def test_kv_cache_events_are_published_on_their_port_and_only_gateways_may_subscribe() -> None:
    run = offline_run(stack_document("prod"), "prod")  # the shipped prod stack publishes them
    namespace = load_spec("prod").spec.cluster.namespace
    rules = _selecting(run, namespace, contract.COMPONENT_ENGINE)
    assert _peers(rules, contract.KV_EVENTS_PORT) == [_component(contract.COMPONENT_GATEWAY)]
    [deployment] = [d for d in run.of_type(DEPLOYMENT) if d.props["metadata"]["name"] == "llmfleet-qwen-7b"]
    [agent] = deployment.props["spec"]["template"]["spec"]["containers"]
    assert {"name": "kv-events", "containerPort": contract.KV_EVENTS_PORT} in agent["ports"]
    args = agent["args"]
    assert args[args.index("--kv-events-port") + 1] == str(contract.KV_EVENTS_PORT)
    # Without the key: no port, no flag, no rule.
    quiet = offline_run(stack_document("prod", **{"pools.0.engine.kvEvents": False}), "prod")
    plain = _selecting(quiet, namespace, contract.COMPONENT_ENGINE)
    assert _peers(plain, contract.KV_EVENTS_PORT) == []
