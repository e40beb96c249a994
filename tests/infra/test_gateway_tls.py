"""TLS on the public listener under mocks: the NLB terminates it on aws, the gateway process on kubernetes."""

from __future__ import annotations

from typing import Any

from fleet.protocol import contract
from fleet.spec.loader import load_spec
from infra.gateway_tier import TLS_POLICY
from infra.offline import OfflineRun
from tests.infra.conftest import stack_run
from tests.support.stacks import stack_document

SERVICE = "kubernetes:core/v1:Service"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
LB = "service.beta.kubernetes.io/aws-load-balancer"


def _gateway(run: OfflineRun, type_token: str) -> dict[str, Any]:
    (found,) = [r for r in run.of_type(type_token) if r.props["metadata"]["name"] == contract.GATEWAY_NAME]
    props: dict[str, Any] = found.props
    return props


def test_prod_nlb_terminates_tls_on_443_with_the_stacks_certificate_and_source_cidrs() -> None:
    run, spec = stack_run("prod"), load_spec("prod").spec
    service = _gateway(run, SERVICE)
    annotations = service["metadata"]["annotations"]
    assert annotations[f"{LB}-ssl-cert"] == spec.gateway.tls.certificate_arn
    assert annotations[f"{LB}-ssl-ports"] == "443"
    assert annotations[f"{LB}-ssl-negotiation-policy"] == TLS_POLICY
    assert annotations[contract.ANN_TLS] == "load-balancer"
    assert [p["port"] for p in service["spec"]["ports"]] == [443]
    assert service["spec"]["loadBalancerSourceRanges"] == spec.gateway.tls.source_cidrs
    assert run.outputs["gatewayUrl"].startswith("https://")


def test_dev_gateway_serves_https_itself_from_its_tls_secret() -> None:
    run, spec = stack_run("dev"), load_spec("dev").spec
    pod = _gateway(run, DEPLOYMENT)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--tls-cert") + 1] == f"{contract.TLS_DIR}/tls.crt"
    assert args[args.index("--tls-key") + 1] == f"{contract.TLS_DIR}/tls.key"
    assert {"name": "tls", "secret": {"secretName": spec.gateway.tls.secret_name}} in pod["volumes"]
    assert all(container[p]["httpGet"]["scheme"] == "HTTPS" for p in ("startupProbe", "livenessProbe"))
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"  # the admin port: plain, inside the pod network
    service = _gateway(run, SERVICE)
    assert service["metadata"]["annotations"][contract.ANN_TLS] == "gateway"
    assert [p["port"] for p in service["spec"]["ports"]] == [443]


def test_a_private_gateway_without_tls_stays_plain_and_internal() -> None:
    from infra.stack_run import offline_run

    run = offline_run(stack_document("prod", **{"gateway.public": False, "gateway.tls": {}}), "prod")
    service = _gateway(run, SERVICE)
    assert service["metadata"]["annotations"][contract.ANN_TLS] == "none"
    assert service["metadata"]["annotations"][f"{LB}-scheme"] == "internal"
    assert [p["port"] for p in service["spec"]["ports"]] == [80]
