"""Control auth under mocks: every control pod presents a projected token, and only the checkers may review them."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.protocol import contract
from fleet.protocol.control_auth import AUDIENCE, CONTROL_TOKEN_FILE_ENV, SERVICE_ACCOUNTS, Kind
from fleet.spec.loader import list_stacks, load_spec
from infra.control_auth import TOKEN_DIR
from tests.infra.conftest import stack_run

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
RBAC = "kubernetes:rbac.authorization.k8s.io/v1"


def _pods(stack: str) -> dict[str, dict[str, Any]]:
    """Component -> pod spec, for the gateway, the control plane and one engine pool."""
    found: dict[str, dict[str, Any]] = {}
    for deployment in stack_run(stack).of_type(DEPLOYMENT):
        component = deployment.props["metadata"]["labels"].get(contract.LABEL_COMPONENT)
        found.setdefault(component, deployment.props["spec"]["template"]["spec"])
    return found


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_control_pod_presents_a_projected_token_for_the_llmfleet_audience(stack: str) -> None:
    pods = _pods(stack)
    expected_kind = {
        contract.COMPONENT_GATEWAY: Kind.GATEWAY,
        contract.COMPONENT_CONTROL_PLANE: Kind.CONTROL_PLANE,
        contract.COMPONENT_ENGINE: Kind.AGENT,
    }
    for component, kind in expected_kind.items():
        pod = pods[component]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "control-token"]
        (source,) = volume["projected"]["sources"]
        assert source["serviceAccountToken"]["audience"] == AUDIENCE
        (container,) = pod["containers"]
        assert {"name": CONTROL_TOKEN_FILE_ENV, "value": f"{TOKEN_DIR}/token"} in container["env"]
        assert any(m["mountPath"] == TOKEN_DIR for m in container["volumeMounts"])
        # The account the pod runs as is the one the control plane maps to its kind.
        assert SERVICE_ACCOUNTS[pod["serviceAccountName"]] == kind, component


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_the_checkers_run_with_auth_on_and_only_they_may_create_token_reviews(stack: str) -> None:
    pods = _pods(stack)
    for component in (contract.COMPONENT_CONTROL_PLANE, contract.COMPONENT_ENGINE):
        args = pods[component]["containers"][0]["args"]
        assert args[args.index("--auth") + 1] == "kubernetes", component
    run = stack_run(stack)
    (role,) = [r for r in run.of_type(f"{RBAC}:ClusterRole") if r.props["metadata"]["name"].endswith("-tokenreview")]
    assert role.props["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    (binding,) = [
        b
        for b in run.of_type(f"{RBAC}:ClusterRoleBinding")
        if b.props["roleRef"]["name"] == role.props["metadata"]["name"]
    ]
    assert {s["name"] for s in binding.props["subjects"]} == {
        contract.CONTROL_PLANE_NAME,
        contract.ENGINE_SERVICE_ACCOUNT,
    }
    engine_args = pods[contract.COMPONENT_ENGINE]["containers"][0]["args"]
    assert engine_args[engine_args.index("--prestop-from") + 1] == "$(HOST_IP)"
