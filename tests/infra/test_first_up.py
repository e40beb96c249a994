"""A first `pulumi up` on an empty account: what each object waits for, and how long Pulumi waits for engines."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.protocol import contract
from fleet.protocol.marks import ANN_FIRST_READY, ANN_NAMESPACE_EXISTING, ANN_PULUMI_TIMEOUT, DEFAULT_AWAIT_S
from infra import offline
from infra.offline import OfflineRun, RecordedResource
from infra.pools import ENGINE_IMAGE_PULL_S
from infra.stack_run import offline_run
from tests.infra.conftest import stack_run
from tests.support.stacks import stack_document

SERVICE = "kubernetes:core/v1:Service"
RELEASE = "kubernetes:helm.sh/v3:Release"
NAMESPACE = "kubernetes:core/v1:Namespace"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"


def waits_for(run: OfflineRun, resource: RecordedResource) -> set[str]:
    """Names of what ``resource`` waits for: its dependencies and its parents', transitively."""
    by_urn = {r.urn: r for r in run.resources}
    seen: set[str] = set()
    todo = [resource]
    while todo:
        current = todo.pop()
        for urn in (*current.dependencies, *([current.parent] if current.parent else [])):
            if urn not in seen and urn in by_urn:
                seen.add(urn)
                todo.append(by_urn[urn])
    return {by_urn[u].name for u in seen}


def _release(run: OfflineRun, chart: str) -> RecordedResource:
    (release,) = [r for r in run.of_type(RELEASE) if r.props["chart"] == chart]
    return release


def _component(resource: RecordedResource) -> str | None:
    return resource.props["metadata"].get("labels", {}).get(contract.LABEL_COMPONENT)


def test_every_service_and_the_metrics_server_chart_wait_for_the_lb_controller(prod: OfflineRun) -> None:
    controller = _release(prod, "aws-load-balancer-controller").name
    waiting = [*prod.of_type(SERVICE), _release(prod, "metrics-server")]
    assert {r.name for r in prod.of_type(SERVICE)} >= {
        "gateway-service",
        "control-plane-service",
        "pool-qwen-7b-service",
    }
    assert [r.name for r in waiting if controller not in waits_for(prod, r)] == []


def test_the_lb_controllers_webhooks_fail_open(prod: OfflineRun) -> None:
    values = _release(prod, "aws-load-balancer-controller").props["values"]
    assert values["serviceMutatorWebhookConfig"] == {"failurePolicy": "Ignore"}
    assert values["podMutatorWebhookConfig"] == {"failurePolicy": "Ignore"}


def test_on_aws_the_dashboards_namespace_is_created_and_awaited(prod: OfflineRun) -> None:
    (monitoring,) = [r for r in prod.of_type(NAMESPACE) if r.props["metadata"]["name"] == "monitoring"]
    dashboards = [r for r in prod.of_type(CONFIG_MAP) if r.props["metadata"]["namespace"] == "monitoring"]
    assert len(dashboards) == 3
    assert all(monitoring.name in waits_for(prod, r) for r in dashboards)


def test_on_kubernetes_the_dashboards_say_the_clusters_namespace_exists(dev: OfflineRun) -> None:
    assert [r.props["metadata"]["name"] for r in dev.of_type(NAMESPACE)] == ["llmfleet-dev"]
    dashboards = [r for r in dev.of_type(CONFIG_MAP) if r.props["metadata"]["namespace"] == "monitoring"]
    assert dashboards and all(
        r.props["metadata"]["annotations"][ANN_NAMESPACE_EXISTING] == "existing" for r in dashboards
    )


@pytest.mark.parametrize("stack", ["prod", "dev"])
def test_every_object_in_the_fleet_namespace_waits_for_it(stack: str) -> None:
    run = stack_run(stack)
    (fleet_ns,) = [r for r in run.of_type(NAMESPACE) if r.props["metadata"]["name"].startswith("llmfleet")]
    namespace = fleet_ns.props["metadata"]["name"]
    inside = [r for r in run.resources if r.custom and r.props.get("metadata", {}).get("namespace") == namespace]
    assert len(inside) > 20
    assert [r.name for r in inside if fleet_ns.name not in waits_for(run, r)] == []


def test_the_fleet_namespace_injects_readiness_gates_on_aws_only(prod: OfflineRun, dev: OfflineRun) -> None:
    label = "elbv2.k8s.aws/pod-readiness-gate-inject"
    (prod_ns,) = [r for r in prod.of_type(NAMESPACE) if r.props["metadata"]["name"] == "llmfleet"]
    assert prod_ns.props["metadata"]["labels"][label] == "enabled"
    assert label not in dev.of_type(NAMESPACE)[0].props["metadata"]["labels"]


def _engine(run: OfflineRun) -> RecordedResource:
    (engine,) = [r for r in run.of_type(DEPLOYMENT) if _component(r) == contract.COMPONENT_ENGINE]
    return engine


def test_engine_deployments_outlast_an_image_pull_and_a_cold_start(prod: OfflineRun) -> None:
    engine = _engine(prod)
    first_ready = ENGINE_IMAGE_PULL_S + 150  # prod's coldStartSeconds
    annotations = engine.props["metadata"]["annotations"]
    assert int(annotations[ANN_FIRST_READY]) == first_ready > DEFAULT_AWAIT_S
    assert engine.props["spec"]["progressDeadlineSeconds"] == first_ready
    assert int(annotations[ANN_PULUMI_TIMEOUT]) > first_ready


def test_a_simulated_pool_keeps_the_default_progress_deadline(dev: OfflineRun) -> None:
    engine = _engine(dev)
    assert int(engine.props["metadata"]["annotations"][ANN_FIRST_READY]) == 30  # dev's coldStartSeconds
    assert engine.props["spec"]["progressDeadlineSeconds"] == DEFAULT_AWAIT_S  # never below Kubernetes' 600 s


def test_engine_deployments_register_custom_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    register = offline._RecordingMonitor.RegisterResource

    def recording(self: Any, request: Any) -> Any:
        seen[request.name] = request.customTimeouts
        return register(self, request)

    monkeypatch.setattr(offline._RecordingMonitor, "RegisterResource", recording)
    offline_run(stack_document("prod"), "prod")
    timeouts = seen["pool-qwen-7b-deployment"]
    create, update = int(timeouts.create.rstrip("s")), int(timeouts.update.rstrip("s"))
    assert create > ENGINE_IMAGE_PULL_S + 150
    assert update >= create + 23 * (150 + 60)  # 24 replicas at most, replaced one at a time


def _template_annotations(run: OfflineRun, component: str) -> dict[str, str]:
    (deployment,) = [r for r in run.of_type(DEPLOYMENT) if _component(r) == component]
    return dict(deployment.props["spec"]["template"]["metadata"]["annotations"])


def _checksums(run: OfflineRun, component: str) -> dict[str, str]:
    return {k: v for k, v in _template_annotations(run, component).items() if k.startswith("checksum.")}


def test_a_rotated_tenant_key_rolls_the_gateways_and_no_engine(prod: OfflineRun) -> None:
    rotated = offline_run(stack_document("prod", **{"tenantKeys:acme": '["sk-rotated"]'}), "prod")
    gateway, rotated_gateway = _checksums(prod, "gateway"), _checksums(rotated, "gateway")
    assert set(gateway) == {
        "checksum.llmfleet.io/stack-file",
        "checksum.llmfleet.io/tenant-keys",
        "checksum.llmfleet.io/engine-api-key",
    }
    assert gateway["checksum.llmfleet.io/tenant-keys"] != rotated_gateway["checksum.llmfleet.io/tenant-keys"]
    assert _checksums(prod, contract.COMPONENT_ENGINE) == _checksums(rotated, contract.COMPONENT_ENGINE)


def test_a_quota_edit_rolls_gateways_and_the_control_plane_and_no_engine(prod: OfflineRun) -> None:
    edited = offline_run(stack_document("prod", **{"tenants.0.requestsPerSecond": 100}), "prod")
    for component in ("gateway", contract.COMPONENT_CONTROL_PLANE):
        assert _checksums(prod, component) != _checksums(edited, component), component
    assert _checksums(prod, contract.COMPONENT_ENGINE) == _checksums(edited, contract.COMPONENT_ENGINE)


def test_a_pool_edit_or_a_new_engine_key_rolls_the_engines(prod: OfflineRun) -> None:
    engine = _checksums(prod, contract.COMPONENT_ENGINE)
    assert set(engine) == {"checksum.llmfleet.io/pool", "checksum.llmfleet.io/engine-api-key"}
    edited = offline_run(stack_document("prod", **{"pools.0.engine.maxNumSeqs": 128}), "prod")
    assert (
        _checksums(edited, contract.COMPONENT_ENGINE)["checksum.llmfleet.io/pool"]
        != engine["checksum.llmfleet.io/pool"]
    )
    rekeyed = offline_run(stack_document("prod", **{"engines:apiKey": "another-key"}), "prod")
    for component in (contract.COMPONENT_ENGINE, "gateway"):
        key = "checksum.llmfleet.io/engine-api-key"
        assert _checksums(rekeyed, component)[key] != _checksums(prod, component)[key]
