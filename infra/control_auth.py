"""Control auth in the cluster: who may call whom is proven with Kubernetes service-account tokens.

Each control plane, gateway and engine pod mounts a projected service-account token for the audience
``llmfleet`` (`fleet.protocol.control_auth.AUDIENCE`), rotated by the kubelet, and names its path in
``$LLMFLEET_CONTROL_TOKEN_FILE``; its process presents it on control calls. The control plane (reports, leases)
and the agents (drains) check callers with the TokenReview API, so their service accounts may create
TokenReviews (a ClusterRole: TokenReview is cluster-scoped) and keep their own account token mounted. The kind
of a caller comes from its service account (`fleet.protocol.control_auth.SERVICE_ACCOUNTS`): the engines', the gateways'
and the control plane's. Agents advertise their pod IP and let the kubelet, calling from the node's IP, reach
``/prestop`` without a header.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from fleet.protocol.control_auth import AUDIENCE, CONTROL_TOKEN_FILE_ENV
from fleet.spec.stack import FleetSpec

__all__ = [
    "TOKEN_DIR",
    "TOKEN_TTL_S",
    "TokenReviewAccess",
    "auth_args",
    "token_env",
    "token_mount",
    "token_volume",
]

TOKEN_DIR = "/var/run/secrets/llmfleet"
TOKEN_TTL_S = 3600  # the kubelet renews the token at 80% of this


def token_volume() -> dict[str, Any]:
    """The projected service-account token for the audience ``llmfleet``."""
    source = {"audience": AUDIENCE, "expiration_seconds": TOKEN_TTL_S, "path": "token"}
    return {"name": "control-token", "projected": {"sources": [{"service_account_token": source}]}}


def token_mount() -> dict[str, Any]:
    return {"name": "control-token", "mount_path": TOKEN_DIR, "read_only": True}


def token_env() -> list[dict[str, Any]]:
    return [{"name": CONTROL_TOKEN_FILE_ENV, "value": f"{TOKEN_DIR}/token"}]


def auth_args() -> list[str]:
    """Control calls are checked with TokenReview."""
    return ["--auth", "kubernetes"]


class TokenReviewAccess(pulumi.ComponentResource):
    """A ClusterRole allowing ``create`` on TokenReviews, bound to the control plane's and the engines' accounts:
    the two that check callers."""

    def __init__(self, name: str, spec: FleetSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:TokenReviewAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        role = f"llmfleet-{spec.environment}-tokenreview"
        labels = {contract.LABEL_ENVIRONMENT: spec.environment}
        k8s.rbac.v1.ClusterRole(
            f"{name}-role",
            metadata={"name": role, "labels": labels},
            rules=[{"api_groups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}],
            opts=child,
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata={"name": role, "labels": labels},
            role_ref={"api_group": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            subjects=[
                {"kind": "ServiceAccount", "name": account, "namespace": spec.cluster.namespace}
                for account in (contract.CONTROL_PLANE_NAME, contract.ENGINE_SERVICE_ACCOUNT)
            ],
            opts=child,
        )
        self.register_outputs({})
