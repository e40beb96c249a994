"""Cluster prerequisites under mocks: installed where the stack needs them, waited for by what needs them.

Each graph check is a function returning what is wrong (empty when nothing is). Every test runs it on the
program's graph and shows it can fail: on a copy of the graph with one dependency or setting taken away, or on
the stack with the switch that turns the prerequisite off.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from pulumi.runtime import mocks as pulumi_mocks

from fleet.protocol import contract
from fleet.spec.loader import load_spec
from infra import offline
from infra.lb_controller import LB_CONTROLLER_SERVICE_ACCOUNT
from infra.metrics_server import METRICS_SERVER_CHART_VERSION
from infra.offline import OfflineRun, RecordedResource
from infra.prometheus_crds import CRDS_CHART, CRDS_CHART_VERSION
from infra.quota_cache import REDIS_PORT
from infra.quota_redis import provisions_redis
from infra.stack_run import offline_run
from policies.prerequisites import cluster_prerequisites_installed
from policies.runner import evaluate
from tests.support.stacks import stack_document

AWS_STACKS = ["prod", "staging"]
KUBERNETES_STACKS = ["dev"]
STACKS = AWS_STACKS + KUBERNETES_STACKS

RELEASE = "kubernetes:helm.sh/v3:Release"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
SECRET = "kubernetes:core/v1:Secret"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
MONITORING = ("kubernetes:monitoring.coreos.com/v1:PrometheusRule", "kubernetes:monitoring.coreos.com/v1:PodMonitor")
EKS_CLUSTER = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
REPLICATION_GROUP = "aws:elasticache/replicationGroup:ReplicationGroup"
SUBNET_GROUP = "aws:elasticache/subnetGroup:SubnetGroup"
SUBNET = "aws:ec2/subnet:Subnet"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "aws:ec2/securityGroupRule:SecurityGroupRule")
LB_TYPE = "service.beta.kubernetes.io/aws-load-balancer-type"
AWS_MANAGED = "arn:aws:iam::aws:policy/"

REDIS_TOKEN = "quota-redis-test-token-7f3a9c"  # what `pulumi config set --secret quotaRedis:authToken` would hold
STACK_REDIS_URL = "rediss://quota.example.internal:6379/0"


class _AutonamingMocks(offline.RecordingMocks):
    """The offline mocks, plus the provider's auto-naming of ElastiCache subnet groups: the program leaves the
    name out, the engine fills one in, and the replication group finds its subnets by that name."""

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        rid, state = super().new_resource(args)
        if args.typ == SUBNET_GROUP and "name" not in state:
            state = {**state, "name": f"{args.name}-0a1b2c3"}
        return rid, state


@functools.cache
def _run_document(stack: str, document_json: str) -> OfflineRun:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(offline, "RecordingMocks", _AutonamingMocks)
        return offline_run(json.loads(document_json), stack)


def _run(stack: str, overrides: Mapping[str, Any] | None = None, *, redis: str | None = None) -> OfflineRun:
    """The program for shipped ``stack`` with ``overrides`` (dotted paths); ``redis``: ``"provisioned"`` (Redis
    quotas, no ``redisUrl``, the password in the stack's secret) or ``"stack-url"`` (Redis quotas at
    `STACK_REDIS_URL`)."""
    document = stack_document(stack, **dict(overrides or {}))
    if redis is not None:
        gateway = document["config"].setdefault("llmfleet:gateway", {})
        gateway["quotaBackend"] = "redis"
        gateway.pop("redisUrl", None)
        if redis == "stack-url":
            gateway["redisUrl"] = STACK_REDIS_URL
        else:
            document["config"]["quotaRedis:authToken"] = REDIS_TOKEN
    return _run_document(stack, json.dumps(document, sort_keys=True))


# Graph editing: what a program change that drops a dependency, a setting or a resource would register.


def _without_dependency(run: OfflineRun, waiter: RecordedResource, dependency: RecordedResource) -> OfflineRun:
    resources = [
        dataclasses.replace(r, dependencies=tuple(d for d in r.dependencies if d != dependency.urn))
        if r.urn == waiter.urn
        else r
        for r in run.resources
    ]
    return dataclasses.replace(run, resources=resources)


def _with_props(run: OfflineRun, resource: RecordedResource, change: Callable[[dict[str, Any]], None]) -> OfflineRun:
    """A copy of ``run`` in which ``change`` edited a copy of ``resource``'s props in place."""
    props = copy.deepcopy(resource.props)
    change(props)
    resources = [dataclasses.replace(r, props=props) if r.urn == resource.urn else r for r in run.resources]
    return dataclasses.replace(run, resources=resources)


def _without(run: OfflineRun, *names: str) -> OfflineRun:
    return dataclasses.replace(run, resources=[r for r in run.resources if r.name not in names])


# Graph reading.


def _releases(run: OfflineRun, chart: str) -> list[RecordedResource]:
    return [r for r in run.of_type(RELEASE) if r.props.get("chart") == chart]


def _monitoring(run: OfflineRun) -> list[RecordedResource]:
    return [r for r in run.resources if r.type in MONITORING]


def _object(run: OfflineRun, type_token: str, name: str) -> RecordedResource:
    (found,) = [r for r in run.of_type(type_token) if r.props["metadata"]["name"] == name]
    return found


def _gateway(run: OfflineRun) -> RecordedResource:
    return _object(run, DEPLOYMENT, contract.GATEWAY_NAME)


def _quota_objects(run: OfflineRun) -> list[RecordedResource]:
    """Whatever the program made for the quota Redis: Secret, in-cluster Deployment and Service, ElastiCache."""
    named = [
        r
        for r in run.resources
        if r.type in (SECRET, DEPLOYMENT, SERVICE) and r.props["metadata"].get("name") == contract.QUOTA_REDIS_NAME
    ]
    return named + run.of_type(REPLICATION_GROUP)


def _redis_servers(run: OfflineRun) -> list[RecordedResource]:
    return [r for r in _quota_objects(run) if r.type != SECRET]


def _not_waiting(run: OfflineRun, waiters: list[RecordedResource], needed: list[RecordedResource]) -> list[str]:
    """The names of ``waiters`` that do not wait for every one of ``needed`` (all of them when nothing is needed)."""
    return sorted(w.name for w in waiters if not needed or not all(run.depends_on(w, n) for n in needed))


# Prometheus Operator CRDs.


def _monitoring_not_waiting_for_crds(run: OfflineRun) -> list[str]:
    return _not_waiting(run, _monitoring(run), _releases(run, CRDS_CHART))


@pytest.mark.parametrize("stack", STACKS)
def test_operator_crds_release_is_installed_before_every_rule_and_monitor(stack: str) -> None:
    run = _run(stack)
    (release,) = _releases(run, CRDS_CHART)
    assert (release.props["version"], release.props["namespace"]) == (CRDS_CHART_VERSION, "kube-system")
    monitoring = _monitoring(run)
    assert {r.type.rsplit(":", 1)[-1] for r in monitoring} == {"PrometheusRule", "PodMonitor"}
    assert _monitoring_not_waiting_for_crds(run) == []

    rule = monitoring[0]
    assert _monitoring_not_waiting_for_crds(_without_dependency(run, rule, release)) == [rule.name]


@pytest.mark.parametrize("stack", STACKS)
def test_opting_out_of_the_operator_crds_installs_no_release_and_marks_the_rules_existing(stack: str) -> None:
    installed = _run(stack)
    opted_out = _run(stack, {"observability.installOperatorCrds": False})
    assert _releases(opted_out, CRDS_CHART) == []
    assert len(_monitoring(opted_out)) == len(_monitoring(installed))
    for run, mark in ((installed, "installed"), (opted_out, "existing")):
        assert {r.props["metadata"]["annotations"][contract.ANN_PROMETHEUS_OPERATOR] for r in _monitoring(run)} == {
            mark
        }
    # With no release to wait for, the check reports every rule and monitor.
    assert _monitoring_not_waiting_for_crds(opted_out) == sorted(r.name for r in _monitoring(opted_out))


# metrics-server.


@pytest.mark.parametrize("stack", STACKS)
def test_metrics_server_is_installed_for_the_gateway_cpu_hpa(stack: str) -> None:
    run = _run(stack)
    (release,) = _releases(run, "metrics-server")
    assert (release.props["version"], release.props["namespace"]) == (METRICS_SERVER_CHART_VERSION, "kube-system")
    assert release.props["values"]["replicas"] >= 2
    (hpa,) = run.of_type(HPA)
    assert [m["resource"]["name"] for m in hpa.props["spec"]["metrics"]] == ["cpu"]

    opted_out = _run(stack, {"cluster.installMetricsServer": False})
    assert _releases(opted_out, "metrics-server") == []
    assert len(opted_out.of_type(HPA)) == 1


# AWS Load Balancer Controller.


def _lb_controller_problems(run: OfflineRun) -> list[str]:
    """What keeps the controller from running as its own IRSA role: missing release, role, trust or policy."""
    releases = _releases(run, "aws-load-balancer-controller")
    if len(releases) != 1:
        return [f"{len(releases)} aws-load-balancer-controller releases"]
    (release,) = releases
    account = release.props["values"]["serviceAccount"]
    role_arn = account.get("annotations", {}).get("eks.amazonaws.com/role-arn")
    roles = [r for r in run.of_type(ROLE) if r.props.get("arn") == role_arn]
    if len(roles) != 1:
        return [f"the release's ServiceAccount names role {role_arn!r}, which the stack does not create"]
    (role,) = roles
    problems = []
    (trust,) = json.loads(role.props["assumeRolePolicy"])["Statement"]
    subjects = {v for k, v in trust["Condition"]["StringEquals"].items() if k.endswith(":sub")}
    if subjects != {f"system:serviceaccount:kube-system:{account['name']}"}:
        problems.append(f"the role trusts {sorted(subjects)}, not the controller's ServiceAccount")
    if not [p for p in run.of_type(ROLE_POLICY) if p.parent == role.urn]:
        problems.append("the role has no policy")
    if not run.depends_on(release, role):
        problems.append("the release does not wait for its role")
    return problems


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_lb_controller_release_runs_as_its_own_irsa_role(stack: str) -> None:
    run = _run(stack)
    assert _lb_controller_problems(run) == []
    (release,) = _releases(run, "aws-load-balancer-controller")
    assert release.props["values"]["serviceAccount"]["name"] == LB_CONTROLLER_SERVICE_ACCOUNT
    assert release.props["values"]["clusterName"] == contract.cluster_name(load_spec(stack).spec.environment)

    (role,) = [r for r in run.of_type(ROLE) if run.depends_on(release, r)]
    assert _lb_controller_problems(_without_dependency(run, release, role)) == [
        "the release does not wait for its role"
    ]


def _external_services_not_waiting_for_the_controller(run: OfflineRun) -> list[str]:
    external = [r for r in run.of_type(SERVICE) if r.props["metadata"].get("annotations", {}).get(LB_TYPE)]
    return _not_waiting(run, external, _releases(run, "aws-load-balancer-controller"))


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_gateway_service_waits_for_the_lb_controller(stack: str) -> None:
    run = _run(stack)
    service = _object(run, SERVICE, contract.GATEWAY_NAME)
    assert service.props["metadata"]["annotations"][LB_TYPE] == "external"
    assert _external_services_not_waiting_for_the_controller(run) == []

    (release,) = _releases(run, "aws-load-balancer-controller")
    broken = _without_dependency(run, service, release)
    assert _external_services_not_waiting_for_the_controller(broken) == [service.name]


@pytest.mark.parametrize("stack", KUBERNETES_STACKS)
def test_kubernetes_target_has_no_lb_controller_and_no_service_needing_one(stack: str) -> None:
    run = _run(stack)
    assert _lb_controller_problems(run) == ["0 aws-load-balancer-controller releases"]
    assert LB_TYPE not in _object(run, SERVICE, contract.GATEWAY_NAME).props["metadata"].get("annotations", {})


# The quota Redis on aws: ElastiCache.

# Replication group setting -> the value a Multi-AZ, encrypted, authenticated quota Redis has.
ELASTICACHE_SETTINGS: dict[str, Any] = {
    "engine": "redis",
    "multiAzEnabled": True,
    "automaticFailoverEnabled": True,
    "transitEncryptionEnabled": True,
    "atRestEncryptionEnabled": True,
    "authToken": REDIS_TOKEN,
}


def _elasticache_problems(run: OfflineRun) -> list[str]:
    groups = run.of_type(REPLICATION_GROUP)
    if len(groups) != 1:
        return [f"{len(groups)} replication groups"]
    props = groups[0].props
    problems = [f"{key}={props.get(key)!r}" for key, want in ELASTICACHE_SETTINGS.items() if props.get(key) != want]
    zones = set(props.get("preferredCacheClusterAzs") or [])
    if props.get("numCacheClusters", 0) < 2 or len(zones) < 2:
        problems.append(f"numCacheClusters={props.get('numCacheClusters')!r} in zones {sorted(zones)}")
    return problems


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_aws_quota_redis_is_multi_az_encrypted_and_authenticated_by_the_stack_secret(stack: str) -> None:
    run = _run(stack, redis="provisioned")
    assert _elasticache_problems(run) == []
    assert run.of_type(REPLICATION_GROUP)[0].props["port"] == REDIS_PORT


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("multiAzEnabled", False),
        ("automaticFailoverEnabled", False),
        ("transitEncryptionEnabled", False),
        ("atRestEncryptionEnabled", False),
        ("authToken", None),
        ("numCacheClusters", 1.0),
    ],
)
def test_aws_quota_redis_check_names_a_missing_setting(setting: str, value: Any) -> None:
    run = _run("prod", redis="provisioned")
    (group,) = run.of_type(REPLICATION_GROUP)
    broken = _with_props(run, group, lambda props: props.update({setting: value}))
    problems = _elasticache_problems(broken)
    assert len(problems) == 1 and problems[0].startswith(f"{setting}=")


def _redis_network_problems(run: OfflineRun) -> list[str]:
    """Where the replication group sits and who reaches it: private subnets, the cluster's security group only."""
    (group,) = run.of_type(REPLICATION_GROUP)
    (cluster,) = run.of_type(EKS_CLUSTER)
    problems = []
    placed = [g for g in run.of_type(SUBNET_GROUP) if g.props.get("name") == group.props.get("subnetGroupName")]
    if len(placed) != 1 or not run.depends_on(group, placed[0]):
        problems.append("not placed in a subnet group of the stack")
    else:
        private = {s.urn for s in run.of_type(SUBNET) if "kubernetes.io/role/internal-elb" in s.props["tags"]}
        used = {s.urn for s in run.of_type(SUBNET) if run.depends_on(placed[0], s)}
        if not used or used != private:
            problems.append("its subnet group is not the private subnets")
    groups = [g for g in run.of_type(SECURITY_GROUP) if run.depends_on(group, g)]
    if len(groups) != 1 or len(group.props.get("securityGroupIds", [])) != 1:
        return [*problems, f"{len(group.props.get('securityGroupIds', []))} security groups"]
    if groups[0].props.get("ingress"):
        problems.append("inline ingress rules on its security group")
    rules = [r for r in run.resources if r.type in INGRESS and run.depends_on(r, groups[0])]
    cluster_group = cluster.props["vpcConfig"]["clusterSecurityGroupId"]
    for rule in rules:
        props = rule.props
        sources = {k: props.get(k) for k in ("cidrIpv4", "cidrIpv6", "prefixListId", "cidrBlocks") if props.get(k)}
        if props.get("referencedSecurityGroupId") != cluster_group or sources:
            problems.append(f"{rule.name} admits {props.get('referencedSecurityGroupId')} {sources}")
        if (props.get("ipProtocol"), props.get("fromPort"), props.get("toPort")) != ("tcp", REDIS_PORT, REDIS_PORT):
            problems.append(
                f"{rule.name} opens {props.get('ipProtocol')} {props.get('fromPort')}-{props.get('toPort')}"
            )
    if not rules:
        problems.append("nothing may reach it")
    return problems


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_aws_quota_redis_sits_in_private_subnets_reachable_only_from_the_cluster(stack: str) -> None:
    run = _run(stack, redis="provisioned")
    assert _redis_network_problems(run) == []


def _open_to_the_internet(run: OfflineRun) -> OfflineRun:
    (rule,) = run.of_type(INGRESS[0])
    return _with_props(run, rule, lambda props: props.update(cidrIpv4="0.0.0.0/0"))


def _in_no_subnet_group(run: OfflineRun) -> OfflineRun:
    (group,) = run.of_type(REPLICATION_GROUP)
    return _with_props(run, group, lambda props: props.pop("subnetGroupName"))


def _in_public_subnets(run: OfflineRun) -> OfflineRun:
    (subnets,) = run.of_type(SUBNET_GROUP)
    public = tuple(s.urn for s in run.of_type(SUBNET) if "kubernetes.io/role/elb" in s.props["tags"])
    resources = [dataclasses.replace(r, dependencies=public) if r.urn == subnets.urn else r for r in run.resources]
    return dataclasses.replace(run, resources=resources)


@pytest.mark.parametrize("breaking", [_open_to_the_internet, _in_no_subnet_group, _in_public_subnets])
def test_aws_quota_redis_network_check_fails_on_an_exposed_redis(breaking: Callable[[OfflineRun], OfflineRun]) -> None:
    assert _redis_network_problems(breaking(_run("prod", redis="provisioned")))


# The quota Redis on kubernetes: in the cluster.


@pytest.mark.parametrize("stack", KUBERNETES_STACKS)
def test_kubernetes_quota_redis_runs_in_the_fleet_namespace(stack: str) -> None:
    run = _run(stack, redis="provisioned")
    namespace = load_spec(stack).spec.cluster.namespace
    assert run.of_type(REPLICATION_GROUP) == []
    server = _object(run, DEPLOYMENT, contract.QUOTA_REDIS_NAME)
    service = _object(run, SERVICE, contract.QUOTA_REDIS_NAME)
    secret = _object(run, SECRET, contract.QUOTA_REDIS_NAME)
    assert {r.props["metadata"]["namespace"] for r in (server, service, secret)} == {namespace}
    assert service.props["spec"]["type"] == "ClusterIP"
    assert f'requirepass "{REDIS_TOKEN}"' in secret.props["stringData"]["redis.conf"]
    host = f"{contract.QUOTA_REDIS_NAME}.{namespace}.svc.cluster.local:{REDIS_PORT}"
    assert secret.props["stringData"][contract.REDIS_URL_KEY] == f"redis://:{REDIS_TOKEN}@{host}/0"
    assert run.depends_on(server, secret)  # its config (the password) is in the Secret


# The gateway and its Redis.


def _gateway_redis_problems(run: OfflineRun) -> list[str]:
    """What keeps the gateway from starting on the provisioned Redis: a Redis or Secret it does not wait for, or
    a URL not read from the Secret."""
    gateway = _gateway(run)
    problems = []
    secrets = [r for r in _quota_objects(run) if r.type == SECRET]
    if not secrets or not _redis_servers(run):
        problems.append("no provisioned Redis and Secret")
    problems += [f"does not wait for {r.name}" for r in _quota_objects(run) if not run.depends_on(gateway, r)]
    pod = gateway.props["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    wanted = {"secretName": contract.QUOTA_REDIS_NAME, "items": [{"key": contract.REDIS_URL_KEY, "path": "url"}]}
    volumes = [v["name"] for v in pod["volumes"] if v.get("secret") == wanted]
    mounts = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in volumes]
    exported = f'{contract.REDIS_URL_ENV}="$$(cat {mounts[0] if mounts else "?"}/url)"'
    if not mounts or exported not in " ".join(container["command"]):
        problems.append(f"{contract.REDIS_URL_ENV} is not read from the Secret's file: {container['command']}")
    annotations = gateway.props["metadata"]["annotations"]
    if (annotations[contract.ANN_QUOTA_BACKEND], annotations.get(contract.ANN_REDIS_URL_FROM)) != ("redis", "secret"):
        problems.append(f"annotated {annotations}")
    return problems


@pytest.mark.parametrize("stack", STACKS)
def test_gateway_waits_for_the_redis_and_its_secret_and_reads_the_url_from_the_secret(stack: str) -> None:
    run = _run(stack, redis="provisioned")
    assert _gateway_redis_problems(run) == []
    servers = {r.type for r in _redis_servers(run)}
    assert servers == ({REPLICATION_GROUP} if stack in AWS_STACKS else {DEPLOYMENT, SERVICE})

    gateway = _gateway(run)
    for needed in _quota_objects(run):
        assert _gateway_redis_problems(_without_dependency(run, gateway, needed)) == [
            f"does not wait for {needed.name}"
        ]


def _holding_the_password(run: OfflineRun) -> list[str]:
    return sorted(r.name for r in run.resources if REDIS_TOKEN in json.dumps(r.props))


@pytest.mark.parametrize("stack", STACKS)
def test_redis_password_is_only_in_the_redis_and_its_secret_never_in_the_gateway(stack: str) -> None:
    run = _run(stack, redis="provisioned")
    secret = _object(run, SECRET, contract.QUOTA_REDIS_NAME)
    expected = [secret.name, *(g.name for g in run.of_type(REPLICATION_GROUP))]
    assert _holding_the_password(run) == sorted(expected)

    gateway = _gateway(run)
    url = secret.props["stringData"][contract.REDIS_URL_KEY]
    plain = [{"name": contract.REDIS_URL_ENV, "value": url}]
    broken = _with_props(
        run,
        gateway,
        lambda props: props["spec"]["template"]["spec"]["containers"][0].update(env=plain, command=["llmfleet"]),
    )
    assert gateway.name in _holding_the_password(broken)
    assert _gateway_redis_problems(broken) == [
        f"{contract.REDIS_URL_ENV} is not read from the Secret's file: ['llmfleet']"
    ]


@pytest.mark.parametrize("stack", STACKS)
def test_a_stack_redis_url_provisions_no_redis(stack: str) -> None:
    run = _run(stack, redis="stack-url")
    assert _quota_objects(run) == []
    gateway = _gateway(run)
    assert gateway.props["metadata"]["annotations"][contract.ANN_REDIS_URL_FROM] == "stack"
    (container,) = gateway.props["spec"]["template"]["spec"]["containers"]
    assert contract.REDIS_URL_ENV not in {e["name"] for e in container.get("env", [])}
    assert "no provisioned Redis and Secret" in _gateway_redis_problems(run)


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_provision_a_redis_exactly_when_they_ask_for_one(stack: str) -> None:
    spec = load_spec(stack).spec
    run = _run(stack)
    assert bool(_redis_servers(run)) == provisions_redis(spec)
    assert (_gateway_redis_problems(run) == []) == provisions_redis(spec)


# EKS and its IAM roles.

# What the AWS provider docs ask each role to have attached before EKS uses it.
CLUSTER_POLICIES = {"AmazonEKSClusterPolicy"}
# No AmazonEKS_CNI_Policy: the VPC CNI has its own IRSA role (tests/infra/test_hardening.py).
# PullOnly (the EKS node-role docs' ECR policy) and SSM core (Session Manager onto a node; infra/nodegroups.py).
NODE_POLICIES = {"AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly", "AmazonSSMManagedInstanceCore"}


def _attachment_problems(run: OfflineRun) -> list[str]:
    """Each EKS cluster and node group against its role's policy attachments: all present, all waited for."""
    users = [(c, "roleArn", CLUSTER_POLICIES) for c in run.of_type(EKS_CLUSTER)]
    users += [(g, "nodeRoleArn", NODE_POLICIES) for g in run.of_type(NODE_GROUP)]
    problems = []
    for user, key, policies in users:
        (role,) = [r for r in run.of_type(ROLE) if r.props.get("arn") == user.props[key]]
        attachments = [a for a in run.of_type(ATTACHMENT) if a.parent == role.urn]
        attached = {str(a.props["policyArn"]).removeprefix(AWS_MANAGED) for a in attachments}
        if attached != policies:
            problems.append(f"{user.name}: its role has {sorted(attached)}")
        problems += [f"{user.name} does not wait for {a.name}" for a in attachments if not run.depends_on(user, a)]
    return problems


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_eks_cluster_and_node_groups_wait_for_their_role_policy_attachments(stack: str) -> None:
    run = _run(stack)
    assert len(run.of_type(EKS_CLUSTER)) == 1 and len(run.of_type(NODE_GROUP)) > 1
    assert _attachment_problems(run) == []

    (cluster,) = run.of_type(EKS_CLUSTER)
    attachment = next(a for a in run.of_type(ATTACHMENT) if run.depends_on(cluster, a))
    assert _attachment_problems(_without_dependency(run, cluster, attachment)) == [
        f"{cluster.name} does not wait for {attachment.name}"
    ]
    group = run.of_type(NODE_GROUP)[0]
    attachment = next(a for a in run.of_type(ATTACHMENT) if run.depends_on(group, a))
    assert _attachment_problems(_without_dependency(run, group, attachment)) == [
        f"{group.name} does not wait for {attachment.name}"
    ]


# The policy pack's view of the same graphs.

VARIANTS: dict[str, Callable[[], OfflineRun]] = {
    **{stack: functools.partial(_run, stack) for stack in STACKS},
    **{f"{stack}-provisioned-redis": functools.partial(_run, stack, redis="provisioned") for stack in STACKS},
    **{f"{stack}-stack-redis-url": functools.partial(_run, stack, redis="stack-url") for stack in STACKS},
    **{
        f"{stack}-existing-operator": functools.partial(_run, stack, {"observability.installOperatorCrds": False})
        for stack in STACKS
    },
    **{
        f"{stack}-existing-metrics-server": functools.partial(_run, stack, {"cluster.installMetricsServer": False})
        for stack in STACKS
    },
}


def _policy_flags(run: OfflineRun) -> list[str]:
    violations = evaluate([r for r in run.resources if r.custom], [cluster_prerequisites_installed])
    return sorted(str(v.resource) for v in violations)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_program_graph_passes_the_prerequisites_policy(variant: str) -> None:
    assert _policy_flags(VARIANTS[variant]()) == []


def _is_monitoring(resource: RecordedResource) -> bool:
    return resource.type in MONITORING


@pytest.mark.parametrize(
    ("variant", "removed", "flagged"),
    [
        ("prod", "prometheus-crds-release", _is_monitoring),
        ("dev", "prometheus-crds-release", _is_monitoring),
        ("staging", "metrics-server-release", lambda r: r.type == HPA),
        ("dev", "metrics-server-release", lambda r: r.type == HPA),
        ("prod", "lb-controller-release", lambda r: r.name == "gateway-service"),
        ("prod-provisioned-redis", "quota-cache-redis", lambda r: r.name == "gateway-deployment"),
        ("dev-provisioned-redis", "quota-redis-deployment", lambda r: r.name == "gateway-deployment"),
        ("dev-provisioned-redis", "quota-redis-secret", lambda r: r.name == "gateway-deployment"),
    ],
)
def test_prerequisites_policy_flags_what_needs_a_removed_prerequisite(
    variant: str, removed: str, flagged: Callable[[RecordedResource], bool]
) -> None:
    run = VARIANTS[variant]()
    expected = sorted(r.name for r in run.resources if r.custom and flagged(r))
    assert expected
    assert _policy_flags(_without(run, removed)) == expected
