"""GPU nodes follow replicas on aws: the control plane is told every GPU node group and may cordon nodes."""

from __future__ import annotations

import pytest

from fleet.protocol import contract
from fleet.spec.loader import list_stacks, load_spec
from infra.offline import OfflineRun, RecordedResource
from tests.infra.conftest import stack_run

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
RBAC = "kubernetes:rbac.authorization.k8s.io/v1"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
AWS_STACKS = [s for s in list_stacks() if load_spec(s).spec.target == "aws"]


def _control_plane_args(run: OfflineRun) -> list[str]:
    (deployment,) = [r for r in run.of_type(DEPLOYMENT) if r.props["metadata"]["name"] == contract.CONTROL_PLANE_NAME]
    (container,) = deployment.props["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_control_plane_names_every_gpu_node_group_in_every_zone(stack: str) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    args = _control_plane_args(run)
    given = {args[i + 1] for i, arg in enumerate(args) if arg == "--nodegroup"}
    groups = {
        r.props["tags"][contract.TAG_GPU_GROUP] + ":" + r.props["tags"][contract.TAG_ZONE]: r
        for r in run.of_type(NODE_GROUP)
        if contract.TAG_GPU_GROUP in r.props["tags"]
    }
    expected = {f"{g.name}:{zone}" for g in spec.gpu_node_groups for zone in spec.zones_of(g)}
    assert set(groups) == expected
    assert given == {f"{key}={groups[key].props['nodeGroupName']}" for key in expected}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_control_plane_may_cordon_nodes_and_nothing_else_cluster_wide(stack: str) -> None:
    run = stack_run(stack)
    (role,) = _node_roles(run)
    assert role.props["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
    ]
    (binding,) = [b for b in run.of_type(f"{RBAC}:ClusterRoleBinding") if b.name.endswith("-nodes-binding")]
    assert binding.props["subjects"][0]["name"] == contract.CONTROL_PLANE_NAME
    assert binding.props["roleRef"]["name"] == role.props["metadata"]["name"]


def test_kubernetes_target_gets_no_cluster_role_for_nodes() -> None:
    run = stack_run("dev")
    assert _node_roles(run) == []
    assert "--nodegroup" not in _control_plane_args(run)


def _node_roles(run: OfflineRun) -> list[RecordedResource]:
    """Cluster-wide roles other than the TokenReview one every target gets (tests/infra/test_control_auth.py)."""
    return [r for r in run.of_type(f"{RBAC}:ClusterRole") if not r.props["metadata"]["name"].endswith("-tokenreview")]
