"""The resource graph each shipped stack produces under mocks (AWS side and Kubernetes side)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleet.capacity.paid import plan_groups
from fleet.protocol import contract
from fleet.slo.rules import pool_rule_groups
from fleet.spec.loader import list_stacks, load_spec
from fleet.spec.stack import FleetSpec
from infra.offline import OfflineRun, RecordedResource
from infra.pools import engine_labels
from tests.infra.conftest import stack_run

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]
AWS_STACKS = [s for s in CLOUD_STACKS if load_spec(s).spec.target == "aws"]


def gpu_groups(run: OfflineRun) -> list[RecordedResource]:
    return [r for r in run.of_type(NODE_GROUP) if r.props["amiType"].endswith("NVIDIA")]


def engine_deployments(run: OfflineRun) -> list[RecordedResource]:
    return [
        r
        for r in run.of_type(DEPLOYMENT)
        if r.props["metadata"]["labels"].get(contract.LABEL_COMPONENT) == contract.COMPONENT_ENGINE
    ]


def pod(deployment: RecordedResource) -> dict[str, Any]:
    return dict(deployment.props["spec"]["template"]["spec"])


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_cloud_stack_builds_namespace_spec_and_one_pool_deployment_per_pool(stack: str) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    names = {r.props["metadata"]["name"] for r in engine_deployments(run)}
    # A P/D pool's prefill role pool (prod-long-prompt) is deployed like any pool.
    assert names == {contract.pool_deployment_name(p.name) for p in spec.engine_pools}
    namespaces = [r.props["metadata"]["name"] for r in run.of_type("kubernetes:core/v1:Namespace")]
    dashboards = [spec.observability.prometheus_namespace] if spec.target == "aws" else []  # made on aws only
    assert sorted(namespaces) == sorted([spec.cluster.namespace, *dashboards])
    assert run.outputs["monthlyCostUsd"]["peak"] == pytest.approx(  # the output is rounded to cents
        sum(g.at_peak.monthly_cost_usd for g in plan_groups(spec)), abs=0.005
    )


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_gpu_node_groups_one_per_zone_with_nvidia_ami_taint_and_labels(stack: str) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    groups = gpu_groups(run)
    expected = {(g.name, z) for g in spec.gpu_node_groups for z in spec.zones_of(g)}
    assert {(r.props["tags"][contract.TAG_GPU_GROUP], r.props["tags"][contract.TAG_ZONE]) for r in groups} == expected
    for group in groups:
        props = group.props
        assert props["amiType"] == "AL2023_x86_64_NVIDIA"
        assert props["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
        assert props["labels"][contract.LABEL_GPU_MODEL] == "a100-80gb"
        assert props["labels"]["pool.llmfleet.io/qwen-7b"] == "true"
        assert len(props["subnetIds"]) == 1  # pinned to its zone's private subnet
    zone_outputs = run.outputs["nodeGroupsPerAz"]
    assert sorted(zone_outputs) == sorted(spec.availability_zones)


def test_prod_has_three_gpu_node_groups_in_three_zones(prod: OfflineRun) -> None:
    groups = gpu_groups(prod)
    assert len(groups) == 3
    assert {g.props["tags"][contract.TAG_ZONE] for g in groups} == {"us-east-1a", "us-east-1b", "us-east-1c"}
    assert {g.props["capacityType"] for g in groups} == {"ON_DEMAND"}
    assert {g.props["instanceTypes"][0] for g in groups} == {"p4de.24xlarge"}


def test_staging_gpu_groups_are_on_demand(prod: OfflineRun) -> None:
    del prod  # Unused: staging has its own run.
    # Not Spot: one instance type and no fallback rarely gets p4de capacity (fleet/spec/validate.py warns).
    assert {g.props["capacityType"] for g in gpu_groups(stack_run("staging"))} == {"ON_DEMAND"}


def test_network_has_public_and_private_subnet_and_nat_per_zone(prod: OfflineRun, prod_spec: FleetSpec) -> None:
    subnets = prod.of_type("aws:ec2/subnet:Subnet")
    public = {s.props["availabilityZone"] for s in subnets if "kubernetes.io/role/elb" in s.props["tags"]}
    private = {s.props["availabilityZone"] for s in subnets if "kubernetes.io/role/internal-elb" in s.props["tags"]}
    zones = set(prod_spec.availability_zones)
    assert public == private == zones
    assert len(prod.of_type("aws:ec2/natGateway:NatGateway")) == len(zones)
    assert all(not s.props.get("mapPublicIpOnLaunch") for s in subnets)


def test_cluster_version_from_stack_secrets_encrypted_and_oidc(prod: OfflineRun, prod_spec: FleetSpec) -> None:
    (cluster,) = prod.of_type("aws:eks/cluster:Cluster")
    assert cluster.props["version"] == prod_spec.cluster.kubernetes_version
    assert cluster.props["encryptionConfig"]["resources"] == ["secrets"]
    assert cluster.props["encryptionConfig"]["provider"]["keyArn"].startswith("arn:")
    (oidc,) = prod.of_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert oidc.props["clientIdLists"] == ["sts.amazonaws.com"]
    assert oidc.props["url"] == cluster.props["identities"][0]["oidcs"][0]["issuer"]


def test_model_bucket_is_versioned_encrypted_and_private(prod: OfflineRun) -> None:
    (bucket,) = prod.of_type("aws:s3/bucket:Bucket")
    name = bucket.props["bucket"]
    (versioning,) = prod.of_type("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.props["bucket"] == name
    assert versioning.props["versioningConfiguration"]["status"] == "Enabled"
    sse = prod.of_type("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")[0]
    assert sse.props["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    (block,) = prod.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(block.props[k] for k in ("blockPublicAcls", "blockPublicPolicy", "restrictPublicBuckets"))


def _inline_policy(run: OfflineRun, role_prefix: str) -> dict[str, Any]:
    (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.startswith(role_prefix)]
    return dict(json.loads(policy.props["policy"]))


def test_autoscaler_may_resize_only_the_fleets_gpu_node_groups(prod: OfflineRun) -> None:
    resize, terminate = _inline_policy(prod, "autoscaler")["Statement"]
    assert set(resize["Action"]) == {"eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"}
    assert sorted(resize["Resource"]) == sorted(g.props["arn"] for g in gpu_groups(prod))
    assert terminate["Action"] == "autoscaling:TerminateInstanceInAutoScalingGroup"
    assert terminate["Condition"]["StringEquals"]["aws:ResourceTag/eks:cluster-name"] == "llmfleet-prod"
    # ... and only these groups' instances (tests/infra/test_autoscaler_scope.py)
    assert sorted(terminate["Condition"]["StringEquals"]["aws:ResourceTag/eks:nodegroup-name"]) == sorted(
        g.props["nodeGroupName"] for g in gpu_groups(prod)
    )


def test_engine_role_only_reads_the_model_bucket(prod: OfflineRun) -> None:
    (bucket,) = prod.of_type("aws:s3/bucket:Bucket")
    statements = _inline_policy(prod, "store-engine")["Statement"]
    assert {a for s in statements for a in [s["Action"]]} == {"s3:ListBucket", "s3:GetObject"}
    assert {s["Resource"] for s in statements} == {bucket.props["arn"], bucket.props["arn"] + "/*"}
    engine_role = [r for r in prod.of_type("aws:iam/role:Role") if r.name == "store-engine"][0]
    trust = json.loads(engine_role.props["assumeRolePolicy"])["Statement"][0]
    assert (
        f"system:serviceaccount:llmfleet:{contract.ENGINE_SERVICE_ACCOUNT}"
        in trust["Condition"]["StringEquals"].values()
    )


def test_launch_templates_encrypt_root_volumes_and_require_imdsv2(prod: OfflineRun) -> None:
    templates = prod.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert len(templates) == 4  # CPU + one per GPU zone
    for template in templates:
        assert template.props["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"
        assert template.props["metadataOptions"]["httpTokens"] == "required"


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_engine_deployments_have_probes_grace_prestop_spread_and_pdb(stack: str) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    pdbs = run.of_type(PDB)
    for deployment in engine_deployments(run):
        pool = spec.pool(deployment.props["metadata"]["labels"][contract.LABEL_POOL])
        spec_pod = pod(deployment)
        (container,) = spec_pod["containers"]
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert spec_pod["terminationGracePeriodSeconds"] == pool.drain.grace_seconds
        assert container["lifecycle"]["preStop"] == {"httpGet": {"path": contract.AGENT_PRESTOP_PATH, "port": "agent"}}
        annotations = deployment.props["metadata"]["annotations"]
        budget = float(annotations[contract.ANN_DRAIN_PROPAGATION]) + float(annotations[contract.ANN_SHUTDOWN_TIMEOUT])
        assert budget + 5 <= spec_pod["terminationGracePeriodSeconds"]
        (spread,) = spec_pod["topologySpreadConstraints"]
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"
        assert spread["labelSelector"]["matchLabels"] == engine_labels(spec, pool)
        assert container["args"][:6] == [
            "agent",
            "--stack",
            contract.stack_file_path(spec.environment),
            "--pool",
            pool.name,
            "--port",
        ]
        args = container["args"]
        assert args[args.index("--engine-port") + 1] == str(contract.ENGINE_PORT)
        assert args[args.index("--advertise-host") + 1] == "$(POD_IP)"
        shm = [v for v in spec_pod["volumes"] if v["name"] == "dshm"][0]
        assert shm["emptyDir"]["medium"] == "Memory"
        selectors = [p.props["spec"]["selector"]["matchLabels"] for p in pdbs]
        assert engine_labels(spec, pool) in selectors


def test_prod_engines_request_tp_gpus_spread_hard_and_cache_on_nvme(prod: OfflineRun, prod_spec: FleetSpec) -> None:
    (deployment,) = engine_deployments(prod)
    pool = prod_spec.pools[0]
    spec_pod = pod(deployment)
    (container,) = spec_pod["containers"]
    tp = str(pool.engine.tensor_parallel_size)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == tp
    assert container["resources"]["requests"]["nvidia.com/gpu"] == tp
    assert container["image"].endswith(f"/engine@{prod_spec.images.engine_digest}")
    assert spec_pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    cache = [v for v in spec_pod["volumes"] if v["name"] == "model-cache"][0]
    assert cache["hostPath"]["path"] == contract.MODEL_CACHE_HOST_PATH
    assert spec_pod["nodeSelector"] == {"pool.llmfleet.io/qwen-7b": "true"}
    assert deployment.props["spec"]["replicas"] == pool.replicas.min


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_only_the_gateway_service_is_a_load_balancer(stack: str) -> None:
    run = stack_run(stack)
    exposed = [s for s in run.of_type(SERVICE) if s.props["spec"].get("type") in ("LoadBalancer", "NodePort")]
    assert [s.props["metadata"]["name"] for s in exposed] == [contract.GATEWAY_NAME]
    headless = [s for s in run.of_type(SERVICE) if s.props["spec"].get("clusterIP") == "None"]
    assert {s.props["metadata"]["name"] for s in headless} == {
        r.props["metadata"]["name"] for r in engine_deployments(run)
    }
    assert run.outputs["gatewayUrl"].startswith("https://")  # every shipped cloud stack serves TLS


def test_prod_gateway_is_an_nlb_with_hpa_pdb_and_zone_spread(prod: OfflineRun, prod_spec: FleetSpec) -> None:
    service = [s for s in prod.of_type(SERVICE) if s.props["metadata"]["name"] == contract.GATEWAY_NAME][0]
    annotations = service.props["metadata"]["annotations"]
    # "external" hands the Service to the AWS Load Balancer Controller, which makes an NLB with pod-IP targets.
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-type"] == "external"
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] == "ip"
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internet-facing"
    (hpa,) = prod.of_type("kubernetes:autoscaling/v2:HorizontalPodAutoscaler")
    assert hpa.props["spec"]["minReplicas"] == prod_spec.gateway.replicas
    gateway = [d for d in prod.of_type(DEPLOYMENT) if d.props["metadata"]["name"] == contract.GATEWAY_NAME][0]
    assert pod(gateway)["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert pod(gateway)["containers"][0]["args"] == [
        "gateway",
        "--stack",
        contract.stack_file_path("prod"),
        "--port",
        str(prod_spec.gateway.port),
        "--admin-port",
        str(prod_spec.gateway.admin_port),
        "--shutdown-timeout",
        str(prod_spec.gateway.drain.shutdown_timeout),
        "--drain-propagation",
        "120",
    ]
    assert any(p.props["metadata"]["name"] == contract.GATEWAY_NAME for p in prod.of_type(PDB))


def test_control_plane_role_scales_only_pool_deployments(prod: OfflineRun, prod_spec: FleetSpec) -> None:
    (role,) = prod.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    rules = role.props["rules"]
    scale = [r for r in rules if r["resources"] == ["deployments/scale"]][0]
    assert scale["resourceNames"] == [contract.pool_deployment_name(p.name) for p in prod_spec.engine_pools]
    assert "patch" in [r for r in rules if r["resources"] == ["pods"]][0]["verbs"]
    [leases] = [r for r in rules if r["resources"] == ["leases"]]  # the control plane's restart-lease store
    assert leases["apiGroups"] == ["coordination.k8s.io"] and "resourceNames" not in leases
    assert sorted(leases["verbs"]) == ["create", "delete", "list", "update"]
    (account,) = [
        s
        for s in prod.of_type("kubernetes:core/v1:ServiceAccount")
        if s.props["metadata"]["name"] == contract.CONTROL_PLANE_NAME
    ]
    assert account.props["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:")
    deployment = [d for d in prod.of_type(DEPLOYMENT) if d.props["metadata"]["name"] == contract.CONTROL_PLANE_NAME][0]
    assert pod(deployment)["containers"][0]["args"][:7] == [
        "control-plane",
        "--stack",
        contract.stack_file_path("prod"),
        "--port",
        str(prod_spec.control_plane.port),
        "--host",
        "0.0.0.0",
    ]  # then one --nodegroup per GPU node group and zone: tests/infra/test_node_scaling.py


def test_device_plugin_runs_only_on_gpu_nodes_and_only_on_aws(prod: OfflineRun, dev: OfflineRun) -> None:
    (daemonset,) = prod.of_type("kubernetes:apps/v1:DaemonSet")
    assert daemonset.props["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert dev.of_type("kubernetes:apps/v1:DaemonSet") == []


def test_prometheus_rules_are_each_pools_generated_slo_rules(prod: OfflineRun, prod_spec: FleetSpec) -> None:
    (rule,) = prod.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert rule.props["spec"]["groups"] == pool_rule_groups(prod_spec.pools[0])  # evaluated: tests/fleet/test_slo_rules
    alerts = {a["alert"]: a for g in rule.props["spec"]["groups"] for a in g["rules"] if "alert" in a}
    assert 'ratio_rate1h{pool="qwen-7b"} > 0.0005' in alerts["LlmfleetAvailabilityNearSlo"]["expr"]  # 99.95%
    assert 'ratio_rate5m{pool="qwen-7b"} > 0.0144' in alerts["LlmfleetAvailabilityBudgetBurnFast"]["expr"]


def test_pod_monitors_scrape_engines_gateways_and_the_control_plane_with_the_pool_label(prod: OfflineRun) -> None:
    monitors = {
        m.props["metadata"]["name"]: m.props["spec"]
        for m in prod.of_type("kubernetes:monitoring.coreos.com/v1:PodMonitor")
    }
    assert set(monitors) == {"llmfleet-engine", "llmfleet-gateway", "llmfleet-control-plane"}
    engine = monitors["llmfleet-engine"]
    assert engine["selector"]["matchLabels"] == {"app.kubernetes.io/component": "engine"}
    assert [e["port"] for e in engine["podMetricsEndpoints"]] == ["engine", "agent"]
    assert [e["port"] for e in monitors["llmfleet-gateway"]["podMetricsEndpoints"]] == ["admin"]  # /metrics there
    # The control plane's replica counts and targets: the dashboards' replica panels and scaling annotations.
    assert [e["port"] for e in monitors["llmfleet-control-plane"]["podMetricsEndpoints"]] == ["http"]
    (relabel,) = engine["podMetricsEndpoints"][0]["relabelings"]
    assert relabel["targetLabel"] == "llmfleet_io_pool"
    (rule,) = prod.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    exprs = [a["expr"] for g in rule.props["spec"]["groups"] for a in g["rules"]]
    assert any('llmfleet_io_pool="qwen-7b"' in e for e in exprs)


def test_kubernetes_target_creates_no_aws_resources(dev: OfflineRun) -> None:
    assert [r.type for r in dev.resources if r.type.startswith("aws:")] == []
    (provider,) = dev.of_type("pulumi:providers:kubernetes")
    assert provider.props["kubeconfig"].endswith("/.kube/config")
    assert dev.outputs["nodeGroupsPerAz"] == {}
