"""The control plane's ``patch`` on nodes is narrowed by an admission policy to cordoning GPU nodes.

The policy's CEL is evaluated with cel-python against node objects shaped like the API server's: it is the
rendered policy (as the program registers it) that is judged, request by request.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from fleet.protocol import contract
from fleet.spec.loader import list_stacks, load_spec
from infra.offline import OfflineRun, RecordedResource
from tests.infra.conftest import stack_run

POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]


def _node_patchers(run: OfflineRun) -> list[dict[str, Any]]:
    """The subjects bound to a ClusterRole that may patch nodes."""
    roles = {
        r.props["metadata"]["name"]
        for r in run.of_type(CLUSTER_ROLE)
        for rule in r.props.get("rules", [])
        if "nodes" in rule.get("resources", []) and {"patch", "update", "*"} & set(rule.get("verbs", []))
    }
    return [
        subject
        for b in run.of_type(CLUSTER_ROLE_BINDING)
        if b.props["roleRef"]["name"] in roles
        for subject in b.props["subjects"]
    ]


def _guard(run: OfflineRun) -> tuple[RecordedResource, RecordedResource]:
    (policy,) = run.of_type(POLICY)
    (binding,) = run.of_type(BINDING)
    return policy, binding


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_whoever_may_patch_nodes_is_matched_by_a_denying_policy(stack: str) -> None:
    run = stack_run(stack)
    patchers = _node_patchers(run)
    if not patchers:
        assert not run.of_type(POLICY)  # the kubernetes target grants no node rights and needs no guard
        return
    policy, binding = _guard(run)
    assert binding.props["spec"]["policyName"] == policy.props["metadata"]["name"]
    assert binding.props["spec"]["validationActions"] == ["Deny"]
    assert run.depends_on(binding, policy)
    spec = policy.props["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    users = {f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in patchers}
    (condition,) = spec["matchConditions"]
    assert {u for u in users if _match(condition["expression"], u)} == users
    assert not _match(condition["expression"], "system:node:ip-10-0-1-2.ec2.internal")


# Evaluation of the rendered CEL.

GPU_NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "ip-10-0-1-2.ec2.internal",
        "labels": {contract.LABEL_NODE_ROLE: "gpu", contract.LABEL_GPU_GROUP: "a100"},
        "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.1.2"},
        "resourceVersion": "41",
    },
    "spec": {
        "providerID": "aws:///us-east-1a/i-0123456789abcdef0",
        "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    },
}


def _cpu_node() -> dict[str, Any]:
    node = copy.deepcopy(GPU_NODE)
    node["metadata"]["labels"] = {contract.LABEL_NODE_ROLE: "cpu"}
    node["spec"].pop("taints")
    return node


def _with(node: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``node`` with the dotted ``path`` set to ``value`` (None removes it)."""
    out = copy.deepcopy(node)
    *parents, leaf = path.split(".")
    target = out
    for key in parents:
        target = target.setdefault(key, {})
    if value is None:
        target.pop(leaf, None)
    else:
        target[leaf] = value
    out["metadata"]["resourceVersion"] = "42"  # every update bumps it: the policy must not look at it
    return out


def _evaluate(expression: str, activation: dict[str, Any]) -> bool:
    """Whether ``expression`` is true for ``activation``; an evaluation error is not (the policy fails closed)."""
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate(celpy.json_to_cel(activation))
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def _match(expression: str, user: str) -> bool:
    return _evaluate(expression, {"request": {"userInfo": {"username": user}}})


def _denials(policy: RecordedResource, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The messages of the policy's validations that fail for an update from ``old`` to ``new``."""
    activation = {"object": new, "oldObject": old}
    return [
        v["message"] for v in policy.props["spec"]["validations"] if _evaluate(v["expression"], activation) is not True
    ]


@pytest.fixture(scope="module")
def policy() -> RecordedResource:
    return _guard(stack_run("prod"))[0]


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("cordon", GPU_NODE, _with(GPU_NODE, "spec.unschedulable", True)),
        ("uncordon", _with(GPU_NODE, "spec.unschedulable", True), _with(GPU_NODE, "spec.unschedulable", None)),
        ("no change", GPU_NODE, _with(GPU_NODE, "spec.unschedulable", None)),
    ],
)
def test_the_control_plane_may_cordon_and_uncordon_a_gpu_node(
    policy: RecordedResource, name: str, old: dict[str, Any], new: dict[str, Any]
) -> None:
    assert _denials(policy, old, new) == [], name


@pytest.mark.parametrize(
    ("name", "old", "new", "field"),
    [
        ("cordon a CPU node", _cpu_node(), _with(_cpu_node(), "spec.unschedulable", True), "labelled"),
        (
            "node without labels",
            _with(GPU_NODE, "metadata.labels", None),
            _with(_with(GPU_NODE, "metadata.labels", None), "spec.unschedulable", True),
            "labelled",
        ),
        ("untaint", GPU_NODE, _with(GPU_NODE, "spec.taints", None), "spec.taints"),
        ("retaint", GPU_NODE, _with(GPU_NODE, "spec.taints", [{"key": "x", "effect": "NoExecute"}]), "spec.taints"),
        (
            "relabel",
            GPU_NODE,
            _with(GPU_NODE, "metadata.labels", {**GPU_NODE["metadata"]["labels"], "pool": "x"}),
            "metadata.labels",
        ),
        (
            "relabel as CPU",
            GPU_NODE,
            _with(GPU_NODE, "metadata.labels", {contract.LABEL_NODE_ROLE: "cpu"}),
            "metadata.labels",
        ),
        ("annotate", GPU_NODE, _with(GPU_NODE, "metadata.annotations", {"a": "b"}), "metadata.annotations"),
        ("add a finalizer", GPU_NODE, _with(GPU_NODE, "metadata.finalizers", ["x/y"]), "metadata.finalizers"),
        ("move the provider ID", GPU_NODE, _with(GPU_NODE, "spec.providerID", "aws:///x/i-1"), "spec.providerID"),
        ("set a pod CIDR", GPU_NODE, _with(GPU_NODE, "spec.podCIDR", "10.1.0.0/24"), "spec.podCIDR"),
    ],
)
def test_the_control_plane_may_change_nothing_else(
    policy: RecordedResource, name: str, old: dict[str, Any], new: dict[str, Any], field: str
) -> None:
    denials = _denials(policy, old, new)
    assert denials, name
    assert all(field in message for message in denials), denials


def test_the_label_it_checks_is_the_one_gpu_node_groups_carry() -> None:
    run = stack_run("prod")
    gpu_groups = [g for g in run.of_type("aws:eks/nodeGroup:NodeGroup") if g.props["amiType"].endswith("NVIDIA")]
    assert gpu_groups
    assert all(g.props["labels"][contract.LABEL_NODE_ROLE] == "gpu" for g in gpu_groups)
