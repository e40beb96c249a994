"""Node guard: an admission policy that narrows the control plane's ``patch`` on nodes to cordoning GPU nodes.

RBAC cannot say which fields of an object a verb may change: the control plane's ClusterRole
(`infra.control_plane_tier`) grants ``patch`` on ``nodes``, which covers every node's labels, taints and
annotations. A stolen control-plane token could then untaint a GPU node or relabel a node to attract pods.
The aws actuator needs one field only: it sets ``spec.unschedulable`` on the GPU nodes a drain emptied before
it terminates them (control_plane/actuators/aws.py). This module adds a ``ValidatingAdmissionPolicy``
(``admissionregistration.k8s.io/v1``, GA since Kubernetes 1.30) and its binding that deny an update of a node
by the control plane's service account unless

* the node carries ``llmfleet.io/node-role: gpu`` (`fleet.protocol.contract.LABEL_NODE_ROLE`), and
* every field the request could change, other than ``spec.unschedulable``, is unchanged (`GUARDED_FIELDS`).

Other users (kubelets, the node lifecycle controller, cluster admins) are outside the policy's
``matchConditions`` and untouched by it. The policy's field names follow the API reference
(https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/validating-admission-policy-v1/).
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s
from pulumi_kubernetes.admissionregistration import v1 as admission

from fleet.protocol import contract
from fleet.spec.stack import FleetSpec

__all__ = [
    "GUARDED_FIELDS",
    "NodeGuard",
    "gpu_node_expression",
    "guard_validations",
    "policy_name",
    "service_account_user",
    "unchanged_expression",
]

# The node fields a patch on the main resource can change, besides spec.unschedulable (status is a subresource
# the ClusterRole does not grant, and the API server drops status changes sent to the main resource). Only
# fields of the Node schema: a field the schema lacks fails the policy's type check, and the policy fails closed.
GUARDED_FIELDS = (
    "metadata.labels",
    "metadata.annotations",
    "metadata.finalizers",
    "metadata.ownerReferences",
    "spec.taints",
    "spec.podCIDR",
    "spec.podCIDRs",
    "spec.providerID",
)


def policy_name(environment: str) -> str:
    """The cluster-scoped name of the policy and of its binding."""
    return f"{contract.CONTROL_PLANE_NAME}-{environment}-nodes"


def service_account_user(namespace: str) -> str:
    """The user name the API server gives the control plane's service-account token."""
    return f"system:serviceaccount:{namespace}:{contract.CONTROL_PLANE_NAME}"


def unchanged_expression(path: str) -> str:
    """CEL: the field at ``path`` is absent in both objects or equal in both (``has`` first: an absent field is
    an error to read, not a null)."""
    new, old = f"object.{path}", f"oldObject.{path}"
    return f"has({new}) == has({old}) && (!has({new}) || {new} == {old})"


def gpu_node_expression() -> str:
    """CEL: the node, as it was before the request, carries the GPU node-role label."""
    labels = "oldObject.metadata.labels"
    key = contract.LABEL_NODE_ROLE
    return f"has({labels}) && '{key}' in {labels} && {labels}['{key}'] == 'gpu'"


def guard_validations() -> list[admission.ValidationArgs]:
    """The policy's validations: a GPU node, then one per guarded field, each with the reason it failed."""
    out = [
        admission.ValidationArgs(
            expression=gpu_node_expression(),
            message=f"the llmfleet control plane may change only nodes labelled {contract.LABEL_NODE_ROLE}=gpu",
            reason="Forbidden",
        )
    ]
    for path in GUARDED_FIELDS:
        out.append(
            admission.ValidationArgs(
                expression=unchanged_expression(path),
                message=f"the llmfleet control plane may change only spec.unschedulable of a node, not {path}",
                reason="Forbidden",
            )
        )
    return out


class NodeGuard(pulumi.ComponentResource):
    """The ``ValidatingAdmissionPolicy`` and its ``Deny`` binding for the control plane's node updates."""

    policy: admission.ValidatingAdmissionPolicy
    binding: admission.ValidatingAdmissionPolicyBinding

    def __init__(self, name: str, spec: FleetSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:NodeGuard", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        policy = policy_name(spec.environment)
        labels = {contract.LABEL_ENVIRONMENT: spec.environment, "app.kubernetes.io/part-of": "llmfleet"}
        self.policy = admission.ValidatingAdmissionPolicy(
            f"{name}-policy",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=policy, labels=labels),
            spec=admission.ValidatingAdmissionPolicySpecArgs(
                # Fail: a policy the API server cannot evaluate denies the control plane's update, never admits it.
                failure_policy="Fail",
                match_constraints=admission.MatchResourcesArgs(
                    resource_rules=[
                        # The ClusterRole grants get/list/watch/patch: a patch reaches admission as an UPDATE.
                        admission.NamedRuleWithOperationsArgs(
                            api_groups=[""], api_versions=["v1"], operations=["UPDATE"], resources=["nodes"]
                        )
                    ]
                ),
                match_conditions=[
                    admission.MatchConditionArgs(
                        name="llmfleet-control-plane",
                        expression=f"request.userInfo.username == '{service_account_user(spec.cluster.namespace)}'",
                    )
                ],
                validations=guard_validations(),
            ),
            opts=child,
        )
        self.binding = admission.ValidatingAdmissionPolicyBinding(
            f"{name}-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=policy, labels=labels),
            spec=admission.ValidatingAdmissionPolicyBindingSpecArgs(policy_name=policy, validation_actions=["Deny"]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.policy]),
        )
        self.register_outputs({"policy": policy})
