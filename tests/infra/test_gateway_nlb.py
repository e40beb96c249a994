"""The gateway behind the NLB: listener attributes, deregistration, preStop and grace, and the URL clients use."""

from __future__ import annotations

from typing import Any

from fleet.protocol import contract
from fleet.protocol.marks import NLB_DEREGISTRATION_S
from infra.offline import OfflineRun, RecordedResource
from infra.stack_run import offline_run
from tests.support.stacks import DELETE, stack_document

LB = "service.beta.kubernetes.io/aws-load-balancer"


def _gateway(run: OfflineRun, type_token: str) -> RecordedResource:
    (resource,) = [
        r
        for r in run.of_type(type_token)
        if r.props["metadata"].get("labels", {}).get(contract.LABEL_COMPONENT) == contract.COMPONENT_GATEWAY
    ]
    return resource


def _annotations(run: OfflineRun) -> dict[str, Any]:
    return dict(_gateway(run, "kubernetes:core/v1:Service").props["metadata"]["annotations"])


def test_a_tls_listener_gets_no_idle_timeout_attribute_the_controller_would_skip(prod: OfflineRun) -> None:
    annotations = _annotations(prod)
    assert annotations[f"{LB}-ssl-ports"] == "443"
    assert [k for k in annotations if "listener-attributes" in k] == []
    assert annotations[contract.ANN_REQUEST_TIMEOUT] == "330"  # prod's totalS, under the fixed 350 s


def test_a_tcp_listener_idles_out_a_minute_after_the_request_timeout() -> None:
    private = stack_document(
        "aws",
        **{
            "gateway.public": False,
            "gateway.tls": {},
            "gateway.timeouts.totalS": 600,
            "pools.0.drain.graceSeconds": 615,
        },
    )
    annotations = _annotations(offline_run(private, "prod"))
    assert annotations[f"{LB}-listener-attributes.TCP-80"] == "tcp.idle_timeout.seconds=660"


def test_the_gateway_keeps_listening_through_the_nlbs_deregistration(prod: OfflineRun) -> None:
    assert _annotations(prod)[f"{LB}-target-group-attributes"] == "deregistration_delay.timeout_seconds=120"
    pod = _gateway(prod, "kubernetes:apps/v1:Deployment").props["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "lifecycle" not in container  # the gateway drains itself on SIGTERM: no preStop sleep to add to it
    propagation = int(container["args"][container["args"].index("--drain-propagation") + 1])
    assert propagation >= NLB_DEREGISTRATION_S
    assert pod["terminationGracePeriodSeconds"] >= propagation + 330 + 5
    assert "--shutdown-timeout" in container["args"]
    shutdown = int(container["args"][container["args"].index("--shutdown-timeout") + 1])
    assert shutdown >= 330


def test_the_gateway_url_is_the_host_name_the_certificate_covers(prod: OfflineRun) -> None:
    assert prod.outputs["gatewayUrl"] == "https://api.llmfleet.example.com"
    assert prod.outputs["gatewayLoadBalancer"] == "gateway-service.elb.us-east-1.amazonaws.com"


def test_without_a_host_name_the_url_is_the_load_balancers() -> None:
    run = offline_run(stack_document("aws", **{"gateway.hostname": DELETE}), "prod")
    assert run.outputs["gatewayUrl"] == "https://gateway-service.elb.us-east-1.amazonaws.com"
