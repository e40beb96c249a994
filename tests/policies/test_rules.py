"""Each policy of the pack, with a passing and a failing case built by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest

from fleet.protocol import contract
from fleet.protocol.marks import ANN_NAMESPACE_EXISTING, ANN_PULUMI_TIMEOUT, ANN_RESUME_STREAMS
from policies.network import is_public_service
from policies.pack import ENFORCEMENT_LEVEL, POLICIES
from policies.runner import Violation, evaluate
from tests.policies.builders import (
    Res,
    bucket,
    capacity_block_group,
    capacity_block_template,
    cluster_role_binding,
    config_map,
    control_plane,
    custom_resource,
    ecr_repository,
    eks_cluster,
    elasticache_redis,
    engine,
    engine_network_policies,
    gateway_deployment,
    gateway_hpa,
    gateway_service,
    gpu_group,
    helm_release,
    launch_template,
    lb_controller,
    namespace,
    network_policy,
    nlb_service,
    pdb,
    prometheus_rule,
    quota_gateway,
    quota_redis_secret,
    role_policy,
    scalable_gpu_group,
    service,
    service_account,
    spec_configmap,
    sse,
    waiting_for,
)
from tests.policies.pd_graph import MISSING as PD_MISSING, Graph, pd_graph
from tests.support.stacks import stack_document

Case = Callable[[], list[Res]]

ELB_ARN = {
    "service.beta.kubernetes.io/aws-load-balancer-ssl-cert": "arn:aws:acm:us-east-1:123456789012:certificate/abc"
}
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
TLS_ON_NLB = {"service.beta.kubernetes.io/aws-load-balancer-ssl-ports": "80"}

NS = namespace()
CONTROLLER = lb_controller()  # its Service webhook fails closed, as chart 1.14.0's default
CRDS = helm_release("prometheus-operator-crds")
SHUTDOWN = contract.ANN_SHUTDOWN_TIMEOUT

# policy name -> (passing resources, failing resources)
SECRET_ENV = {"name": "LLMFLEET_ENGINE_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "api-key"}}}
SECRET_FILE = {"name": "k", "secret": {"secretName": "k"}}
READ_ONLY = "container.securityContext.readOnlyRootFilesystem"

CASES: dict[str, tuple[Case, Case]] = {
    "api-token-only-where-used": (
        lambda: [
            control_plane(),
            cluster_role_binding(contract.CONTROL_PLANE_NAME),  # the control plane calls the API: its token is used
            engine(**{"pod.serviceAccountName": "engine", "pod.automountServiceAccountToken": False}),
            gateway_deployment(),
            service_account("default", automount=False),  # the gateway runs as "default", which mounts none
        ],
        # A pod under an account that nothing grants, with no automount setting on the pod or the account.
        lambda: [engine(**{"pod.serviceAccountName": "engine"}), service_account("engine")],
    ),
    "secrets-mounted-as-files": (
        lambda: [engine(**{"pod.volumes": [SECRET_FILE]}), gateway_deployment()],
        lambda: [engine(**{"container.env": [SECRET_ENV]})],
    ),
    "engines-and-gateways-read-only-root": (
        lambda: [engine(**{READ_ONLY: True}), control_plane()],  # the control plane is not held to it
        lambda: [engine(**{READ_ONLY: False}), engine(**{READ_ONLY: None})],
    ),
    "namespaces-created-first": (
        lambda: [
            NS,
            waiting_for(spec_configmap(), NS),
            helm_release("metrics-server"),  # kube-system
            config_map("dashboards", "monitoring", {ANN_NAMESPACE_EXISTING: "existing"}),
        ],
        # The fleet's namespace made at the same time as its ConfigMap; dashboards in a namespace nobody makes.
        lambda: [NS, spec_configmap(), config_map("dashboards", "monitoring")],
    ),
    "services-wait-for-lb-controller": (
        lambda: [
            CONTROLLER,
            waiting_for(service(), CONTROLLER),
            waiting_for(helm_release("metrics-server"), CONTROLLER),
            CRDS,  # renders no Service
        ],
        lambda: [CONTROLLER, service(), helm_release("metrics-server")],
    ),
    "custom-resources-after-crds": (
        lambda: [CRDS, waiting_for(prometheus_rule(), CRDS), prometheus_rule("PodMonitor", operator="existing")],
        # A rule racing the CRDs' release, and a kind nothing in the stack defines.
        lambda: [CRDS, prometheus_rule(), custom_resource()],
    ),
    "slow-starts-awaited": (
        lambda: [engine(), engine(ann={contract.ANN_ENGINE_KIND: "sim", "llmfleet.io/first-ready-seconds": "150"})],
        # Kubernetes' default progress deadline (600 s), and Pulumi's default await (600 s).
        lambda: [engine(**{"spec.progressDeadlineSeconds": None}), engine(ann={ANN_PULUMI_TIMEOUT: "600"})],
    ),
    "request-timeout-fits-listener": (
        lambda: [gateway_service(330, tls=True), gateway_service(600, tls=False, idle=660)],
        # 600 s behind the fixed 350 s of a TLS listener, and behind a TCP listener's default 350 s.
        lambda: [gateway_service(600, tls=True), gateway_service(600, tls=False)],
    ),
    "gateway-drain-covers-deregistration": (
        lambda: [
            gateway_service(330, delay=120),
            gateway_deployment(propagation=120, grace=455),
            gateway_deployment(pre_stop=60, propagation=60, grace=455),
        ],
        # Listening 10 s after SIGTERM while the NLB keeps sending new connections for 120 s.
        lambda: [gateway_service(330, delay=120), gateway_deployment(propagation=10, grace=615)],
    ),
    "engine-grace-covers-longest-request": (
        lambda: [
            gateway_service(330),
            engine(ann={SHUTDOWN: "330"}),
            engine(ann={SHUTDOWN: "105", ANN_RESUME_STREAMS: "true"}),
            engine(ann={SHUTDOWN: "22", contract.ANN_ENGINE_KIND: "sim"}),
        ],
        lambda: [gateway_service(330), engine(ann={SHUTDOWN: "105"})],
    ),
    "gpu-capacity-spans-zones": (
        lambda: [gpu_group("us-east-1a"), gpu_group("us-east-1b")],
        lambda: [gpu_group("us-east-1a")],
    ),
    "pools-spread-across-zones": (
        lambda: [
            engine(),
            engine(env="dev", **{"pod.topologySpreadConstraints.0.whenUnsatisfiable": "ScheduleAnyway"}),
        ],
        lambda: [engine(**{"pod.topologySpreadConstraints": None})],
    ),
    "gpu-requests-match-tensor-parallel": (
        lambda: [engine(), engine(ann={"llmfleet.io/engine-kind": "sim"}, **{"container.resources": None})],
        lambda: [engine(**{"container.resources.limits": {"nvidia.com/gpu": "1"}})],
    ),
    "gpu-memory-headroom": (
        lambda: [engine(ann={"llmfleet.io/gpu-memory-utilization": "0.95"})],
        lambda: [engine(ann={"llmfleet.io/gpu-memory-utilization": "0.97"})],
    ),
    "engine-has-pdb": (
        lambda: [engine(), pdb()],
        lambda: [engine(), pdb(namespace="other")],
    ),
    "engine-has-probes": (
        lambda: [engine()],
        lambda: [engine(**{"container.startupProbe": None})],
    ),
    "engine-grace-covers-drain": (
        lambda: [
            engine(),
            engine(
                **{
                    "pod.terminationGracePeriodSeconds": 135,
                    "container.lifecycle": {"preStop": {"exec": {"command": ["sleep", "15"]}}},
                }
            ),
        ],
        # A preStop that sleeps the propagation delay before the agent waits it again: 10 + 10 + 105 + 5 > 120.
        lambda: [engine(**{"container.lifecycle": {"preStop": {"sleep": {"seconds": 10.0}}}})],
    ),
    "engines-run-as-non-root": (
        lambda: [engine()],
        # The init container that chowned a root-owned hostPath: uid 0 in an engine pod.
        lambda: [
            engine(
                **{
                    "pod.initContainers": [
                        {"name": "model-cache", "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False}}
                    ]
                }
            )
        ],
    ),
    "prod-min-replicas": (
        lambda: [engine(), engine(env="dev", ann={"llmfleet.io/replicas-min": "1"})],
        lambda: [engine(ann={"llmfleet.io/replicas-min": "1"})],
    ),
    "prod-capacity-buffer": (
        lambda: [engine(ann={"llmfleet.io/capacity-buffer": "0.5"})],
        lambda: [engine(ann={"llmfleet.io/capacity-buffer": "0.1"})],
    ),
    "only-gateway-public": (
        lambda: [
            service("LoadBalancer", "gateway"),
            service("ClusterIP", "engine"),
            service("LoadBalancer", "control-plane", {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}),
        ],
        lambda: [service("LoadBalancer", "engine")],
    ),
    "network-default-deny": (
        lambda: [engine(), *engine_network_policies()],
        # Engines open to every pod of the cluster that runs in any namespace.
        lambda: [engine(), *engine_network_policies({"namespaceSelector": {}})],
    ),
    "public-listener-tls": (
        lambda: [
            service("LoadBalancer", "gateway", {**TLS_ON_NLB, **ELB_ARN}),
            service("LoadBalancer", "gateway", {"llmfleet.io/tls": "gateway"}),
            service("LoadBalancer", "gateway", {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}),
        ],
        # The gateway on a public NLB with plain TCP on port 80: bearer keys in clear text.
        lambda: [service("LoadBalancer", "gateway")],
    ),
    "buckets-encrypted": (
        lambda: [bucket(), sse()],
        lambda: [bucket(), sse("another-bucket")],
    ),
    "volumes-encrypted": (
        lambda: [launch_template(), gpu_group("us-east-1a")],
        lambda: [launch_template(encrypted="false")],
    ),
    "imds-hop-limit-one": (
        lambda: [launch_template()],
        # Hop limit 2: a pod's request still reaches IMDS through the node's network namespace.
        lambda: [launch_template(hop_limit=2.0)],
    ),
    "cluster-endpoint-restricted": (
        lambda: [eks_cluster(), eks_cluster(public_cidrs=["203.0.113.0/24"])],
        lambda: [eks_cluster(public_cidrs=["203.0.113.0/24", "0.0.0.0/0"])],
    ),
    "cluster-secrets-encrypted": (
        lambda: [eks_cluster()],
        lambda: [eks_cluster(encrypted=False)],
    ),
    "allowed-instance-types": (
        lambda: [gpu_group("us-east-1a"), launch_template(instance_type="p4de.24xlarge")],
        lambda: [gpu_group("us-east-1a", instance="x2iedn.32xlarge")],
    ),
    "gpu-nodes-can-scale": (
        lambda: [
            scalable_gpu_group("us-east-1a"),
            control_plane("aws", ("gpu-us-east-1a",)),
            role_policy((scalable_gpu_group("us-east-1a").props["arn"],)),
            gpu_group("us-east-1b", max_size=1),  # a fixed size (1..1) needs nothing to change it
        ],
        # Staging before: GPU groups at 0 nodes, the control plane on the kubernetes actuator (pods only).
        lambda: [
            scalable_gpu_group("us-east-1a"),
            control_plane("kubernetes"),
            role_policy((scalable_gpu_group("us-east-1a").props["arn"],)),
        ],
    ),
    "images-pinned-by-digest": (
        lambda: [engine(), control_plane()],
        lambda: [engine(**{"container.image": "docker.io/vllm/vllm-openai:latest"})],
    ),
    "images-from-stack-registries": (
        lambda: [eks_cluster(), ecr_repository(), engine(), control_plane()],
        # Pinned, but pulled from outside the account: the pods depend on a public registry to start.
        lambda: [
            eks_cluster(),
            ecr_repository(),
            engine(**{"container.image": "docker.io/vllm/vllm-openai@sha256:" + "1" * 64}),
        ],
    ),
    "cluster-prerequisites-installed": (
        lambda: [
            helm_release("prometheus-operator-crds"),
            prometheus_rule(),
            prometheus_rule("PodMonitor"),
            helm_release("metrics-server"),
            gateway_hpa(),
            eks_cluster(),
            helm_release("aws-load-balancer-controller"),
            nlb_service(),
            quota_gateway(),
            quota_redis_secret(),
            elasticache_redis(),
        ],
        # An aws stack whose objects need what nobody installed: CRDs, metrics-server, the controller, the Redis.
        lambda: [
            prometheus_rule(),
            gateway_hpa(),
            eks_cluster(),
            nlb_service(),
            quota_gateway(),
            quota_redis_secret(),
        ],
    ),
    "monthly-cost-ceiling": (
        # 3 zones x 2 nodes x 8 GPUs x $2.5 x 730 h = $87,600 under the stack file's $250,000
        lambda: [spec_configmap(), *(gpu_group(z) for z in ZONES)],
        # Capacity blocks at 6 nodes a zone: $262,800, priced from their launch templates' instance type.
        lambda: [
            spec_configmap(),
            *(capacity_block_group(z, max_size=6) for z in ZONES),
            *(capacity_block_template(z) for z in ZONES),
        ],
    ),
    "paid-gpu-utilisation": (
        # 700 QPS: 20 replicas on one 8-GPU node per zone, 20 of 24 paid GPUs used at peak (83%).
        lambda: [
            spec_configmap(document=stack_document("prod", **{"pools.0.workload.peakQps": 700})),
            *(gpu_group(z) for z in ZONES),
        ],
        # Prod as shipped: 6 replicas at peak on the 24 GPUs of one p4de per zone (25%).
        lambda: [spec_configmap(document=stack_document("prod")), *(gpu_group(z) for z in ZONES)],
    ),
}


def _pd_case(apply: Callable[[Graph], Graph] | None) -> Case:
    """The P/D stack's graph from the mocked program (`tests.policies.pd_graph`), edited by ``apply`` if given: the
    EFA rules check what the program builds across many resources, which a hand-built case would only restate."""
    return lambda: cast(list[Res], apply(pd_graph()) if apply else pd_graph())


CASES.update({name: (_pd_case(None), _pd_case(apply)) for name, (_, apply) in PD_MISSING.items()})

BY_NAME = {p.name: p for p in POLICIES}


def run(name: str, resources: list[Res]) -> list[Violation]:
    return evaluate(resources, [BY_NAME[name]])


def test_every_policy_has_a_case() -> None:
    assert set(CASES) == set(BY_NAME)


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy_passes_its_passing_case(name: str) -> None:
    assert run(name, CASES[name][0]()) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy_fails_its_failing_case_and_states_the_risk(name: str) -> None:
    violations = run(name, CASES[name][1]())
    assert violations, f"{name} accepted its failing case"
    assert {v.policy for v in violations} == {name}
    assert all("Risk:" in v.message for v in violations)
    if name != "monthly-cost-ceiling":  # a stack-wide rule: no single resource is at fault
        assert all(v.urn for v in violations)


def test_capacity_buffer_and_paid_gpu_utilisation_are_advisory_and_the_rest_mandatory() -> None:
    advisory = {p.name for p in POLICIES if p.enforcement_level is not None and p.enforcement_level.value == "advisory"}
    assert advisory == {"prod-capacity-buffer", "paid-gpu-utilisation"}
    mandatory = {p.name for p in POLICIES if (p.enforcement_level or ENFORCEMENT_LEVEL).value == "mandatory"}
    assert mandatory == {p.name for p in POLICIES} - advisory


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"monthly-cost-ceiling": {"monthlyCeilingUsd": {"prod": 50_000}}}, ["monthly-cost-ceiling"]),
        ({"monthly-cost-ceiling": {"gpuHourUsd": 10.0}}, ["monthly-cost-ceiling"]),
        ({"monthly-cost-ceiling": {"enforcementLevel": "disabled", "monthlyCeilingUsd": {"prod": 1}}}, []),
        ({"allowed-instance-types": {"allowedInstanceTypes": ["p5.48xlarge"]}}, ["allowed-instance-types"] * 3),
    ],
)
def test_policy_config_overrides_defaults(config: dict[str, dict[str, object]], expected: list[str]) -> None:
    groups = [gpu_group(z) for z in ZONES]
    resources = [
        *groups,
        NS,
        waiting_for(spec_configmap(), NS),
        control_plane(),
        cluster_role_binding(contract.CONTROL_PLANE_NAME),
    ]
    assert [v.policy for v in evaluate(resources, POLICIES, config)] == expected


def _ceiling_violations(resources: list[Res], config: dict[str, object] | None = None) -> list[Violation]:
    return evaluate(resources, [BY_NAME["monthly-cost-ceiling"]], {"monthly-cost-ceiling": config or {}})


def test_cost_ceiling_comes_from_the_stack_file() -> None:
    groups = [gpu_group(z) for z in ZONES]  # $87,600 a month at $2.5 per GPU-hour
    assert _ceiling_violations([*groups, spec_configmap(cost={"gpuHourUsd": 2.5, "monthlyCeilingUsd": 90_000})]) == []
    (violation,) = _ceiling_violations([*groups, spec_configmap(cost={"gpuHourUsd": 2.5, "monthlyCeilingUsd": 80_000})])
    assert "$87,600/month" in violation.message and "$80,000 ceiling" in violation.message


def test_cost_uses_the_stack_files_gpu_hour_price_else_the_catalogues() -> None:
    groups = [gpu_group(z) for z in ZONES]
    (violation,) = _ceiling_violations([*groups, spec_configmap(cost={"gpuHourUsd": 5.0, "monthlyCeilingUsd": 90_000})])
    assert "$175,200/month" in violation.message
    (violation,) = _ceiling_violations([*groups, spec_configmap(cost={"monthlyCeilingUsd": 1})])
    assert "$1 ceiling" in violation.message  # priced at the catalogue's A100 rate, still over $1


def test_policy_config_ceiling_wins_over_the_stack_files() -> None:
    resources = [*(gpu_group(z) for z in ZONES), spec_configmap(cost={"monthlyCeilingUsd": 10_000})]
    # Three p4de groups of 2 at the catalogue's $27.44705 an instance-hour: $120,218 a month.
    assert _ceiling_violations(resources, {"monthlyCeilingUsd": {"prod": 125_000}}) == []
    assert _ceiling_violations(resources, {"monthlyCeilingUsd": {"staging": 125_000}}) != []


def test_a_stack_without_a_ceiling_has_none() -> None:
    groups = [gpu_group(z, max_size=100) for z in ZONES]
    assert _ceiling_violations([*groups, spec_configmap(cost={"gpuHourUsd": 2.5})]) == []
    assert _ceiling_violations(groups) == []


def test_capacity_block_groups_count_at_their_max_size() -> None:
    blocks = [capacity_block_group(z, max_size=6) for z in ZONES]
    cost = {"gpuHourUsd": 2.5, "monthlyCeilingUsd": 250_000}
    (violation,) = _ceiling_violations(
        [spec_configmap(cost=cost), *blocks, *(capacity_block_template(z) for z in ZONES)]
    )
    assert "$262,800/month" in violation.message


def test_a_gpu_group_without_a_known_instance_type_is_reported_not_priced_at_zero() -> None:
    blocks = [capacity_block_group(z) for z in ZONES]  # no launch template names their instance type
    (violation,) = _ceiling_violations([spec_configmap(), *blocks])
    assert "no instance type the catalogue prices" in violation.message and "nodes-a100-us-east-1a" in violation.message


def test_enforcement_level_override_is_reported() -> None:
    (violation,) = evaluate(
        [gpu_group("us-east-1a"), control_plane(), cluster_role_binding(contract.CONTROL_PLANE_NAME)],
        POLICIES,
        {"gpu-capacity-spans-zones": {"enforcementLevel": "advisory"}},
    )
    assert violation.level == "advisory" and not violation.mandatory


@pytest.mark.parametrize(
    ("kind", "annotations", "public"),
    [
        ("ClusterIP", {}, False),
        ("NodePort", {}, True),
        ("LoadBalancer", {}, True),
        ("LoadBalancer", {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}, False),
    ],
)
def test_public_service_detection(kind: str, annotations: dict[str, str], public: bool) -> None:
    assert is_public_service(service(kind, "x", annotations).props) is public


@pytest.mark.parametrize(
    ("resources", "says"),
    [
        (lambda: [engine()], "no default-deny"),
        (lambda: [engine(), *engine_network_policies()[1:]], "no default-deny"),
        (lambda: [engine(), *engine_network_policies({"ipBlock": {"cidr": "0.0.0.0/0"}})], "ipBlock"),
        (lambda: [engine(), *engine_network_policies({"podSelector": {}})], "component 'any'"),
        (
            lambda: [engine(), *engine_network_policies(), network_policy("open", None, [{"ports": [{"port": 8001}]}])],
            "admits any source",
        ),
    ],
)
def test_network_default_deny_names_what_lets_traffic_in(resources: Case, says: str) -> None:
    (violation,) = run("network-default-deny", resources())
    assert says in violation.message


def test_a_public_endpoint_without_cidrs_counts_as_open_to_everyone() -> None:
    cluster = eks_cluster(public_cidrs=[])
    (violation,) = run("cluster-endpoint-restricted", [cluster])
    assert "no publicAccessCidrs" in violation.message


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"pod.securityContext": None}, "does not set runAsNonRoot"),
        ({"container.securityContext.runAsUser": 0}, "runs as uid 0"),
        ({"container.securityContext.allowPrivilegeEscalation": None}, "may escalate privileges"),
        ({"container.securityContext.privileged": True}, "is privileged"),
    ],
)
def test_engines_run_as_non_root_names_each_way_to_root(changes: dict[str, object], says: str) -> None:
    (violation,) = run("engines-run-as-non-root", [engine(**changes)])
    assert says in violation.message
