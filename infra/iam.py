"""IAM: least-privilege roles. Service roles for EKS and its nodes, and IRSA roles bound to one ServiceAccount.

Policy documents are pure functions of ARNs (`autoscaler_policy`, `model_read_policy`, `tokenizer_read_policy`) so
tests read them as JSON: the autoscaler may resize only the node groups it is given, engines may only read the model
bucket, gateways only the manifests and tokenizer files in it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from fleet.protocol.model_manifest import MANIFEST_NAME
from fleet.tokenizer import TOKENIZER_FILES

__all__ = [
    "ServiceRole",
    "autoscaler_policy",
    "irsa_trust_policy",
    "irsa_managed_role",
    "irsa_role",
    "model_read_policy",
    "nodegroup_name",
    "service_role",
    "tokenizer_read_policy",
]

_AWS_MANAGED = "arn:aws:iam::aws:policy/"


def _document(statements: list[dict[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


def _irsa_trust(oidc: aws.iam.OpenIdConnectProvider, namespace: str, service_account: str) -> pulumi.Output[str]:
    return pulumi.Output.all(oidc.arn, oidc.url).apply(
        lambda v: irsa_trust_policy(str(v[0]), str(v[1]).removeprefix("https://"), namespace, service_account)
    )


def _with_managed(name: str, role: aws.iam.Role, managed_policies: Sequence[str]) -> ServiceRole:
    """``role`` with AWS-managed policies attached by name, each attachment a child of the role."""
    attachments = [
        aws.iam.RolePolicyAttachment(
            f"{name}-{policy.lower()}",
            role=role.name,
            policy_arn=_AWS_MANAGED + policy,
            opts=pulumi.ResourceOptions(parent=role),
        )
        for policy in managed_policies
    ]
    return ServiceRole(role, attachments)


@dataclass(frozen=True)
class ServiceRole:
    """A service role and its policy attachments: whatever uses the role must ``depends_on`` the attachments, or
    EKS may create the cluster (or node group) before the role may do anything and fail or never turn ready."""

    role: aws.iam.Role
    attachments: list[aws.iam.RolePolicyAttachment]

    @property
    def arn(self) -> pulumi.Output[str]:
        return self.role.arn


def service_role(
    name: str, service: str, managed_policies: Sequence[str], parent: pulumi.Resource, tags: dict[str, str]
) -> ServiceRole:
    """A role ``service`` (e.g. ``eks.amazonaws.com``) assumes, with AWS-managed policies attached by name."""
    role = aws.iam.Role(
        name,
        assume_role_policy=_document(
            [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]
        ),
        tags=tags,
        opts=pulumi.ResourceOptions(parent=parent),
    )
    return _with_managed(name, role, managed_policies)


def irsa_trust_policy(provider_arn: str, issuer: str, namespace: str, service_account: str) -> str:
    """Trust one ServiceAccount's projected token from the cluster's OIDC issuer (``issuer`` without https://)."""
    return _document(
        [
            {
                "Effect": "Allow",
                "Principal": {"Federated": provider_arn},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{issuer}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                        f"{issuer}:aud": "sts.amazonaws.com",
                    }
                },
            }
        ]
    )


def irsa_role(
    name: str,
    oidc: aws.iam.OpenIdConnectProvider,
    namespace: str,
    service_account: str,
    policy: pulumi.Input[str],
    parent: pulumi.Resource,
    tags: dict[str, str],
) -> aws.iam.Role:
    """A role only ``namespace/service_account`` can assume, with one inline ``policy``."""
    trust = _irsa_trust(oidc, namespace, service_account)
    role = aws.iam.Role(name, assume_role_policy=trust, tags=tags, opts=pulumi.ResourceOptions(parent=parent))
    aws.iam.RolePolicy(name, role=role.id, policy=policy, opts=pulumi.ResourceOptions(parent=role))
    return role


def irsa_managed_role(
    name: str,
    oidc: aws.iam.OpenIdConnectProvider,
    namespace: str,
    service_account: str,
    managed_policies: Sequence[str],
    parent: pulumi.Resource,
    tags: dict[str, str],
) -> ServiceRole:
    """A role only ``namespace/service_account`` can assume, with AWS-managed policies attached by name."""
    trust = _irsa_trust(oidc, namespace, service_account)
    role = aws.iam.Role(name, assume_role_policy=trust, tags=tags, opts=pulumi.ResourceOptions(parent=parent))
    return _with_managed(name, role, managed_policies)


def nodegroup_name(arn: str) -> str:
    """The node group name in an EKS node group ARN, ``arn:<partition>:eks:<region>:<account>:nodegroup/<cluster>/
    <name>/<id>``. An ARN whose resource is ``nodegroup/<name>`` alone (as the offline mocks answer) names it
    directly. ValueError for anything else."""
    resource = arn.split(":", 5)[-1]
    kind, _, path = resource.partition("/")
    parts = path.split("/")
    if kind != "nodegroup" or not all(parts):
        raise ValueError(f"not a node group ARN: {arn!r}")
    if len(parts) == 3:
        return parts[1]
    if len(parts) == 1:
        return parts[0]
    raise ValueError(f"not a node group ARN: {arn!r}")


def autoscaler_policy(node_group_arns: Sequence[str], cluster_name: str) -> str:
    """Describe and resize exactly these node groups, and terminate instances of exactly these node groups.

    Scale-in terminates the node a drain emptied (``TerminateInstanceInAutoScalingGroup`` with a decrement).
    EKS tags each managed node group's Auto Scaling group ``eks:cluster-name`` and ``eks:nodegroup-name``; the
    right is scoped by both, so the CPU group (same cluster, another name) and any other node group are out of
    reach.
    """
    if not node_group_arns:
        return _document([{"Effect": "Deny", "Action": "eks:UpdateNodegroupConfig", "Resource": "*"}])
    names = sorted({nodegroup_name(arn) for arn in node_group_arns})
    return _document(
        [
            {
                "Sid": "ResizeOwnNodeGroups",
                "Effect": "Allow",
                "Action": ["eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"],
                "Resource": sorted(node_group_arns),
            },
            {
                "Sid": "TerminateDrainedNodes",
                "Effect": "Allow",
                "Action": "autoscaling:TerminateInstanceInAutoScalingGroup",
                "Resource": "*",
                "Condition": {
                    "StringEquals": {
                        "aws:ResourceTag/eks:cluster-name": cluster_name,
                        "aws:ResourceTag/eks:nodegroup-name": names,
                    }
                },
            },
        ]
    )


def model_read_policy(bucket_arn: str) -> str:
    """Read objects of the model bucket (and list it); no write, no delete, no other bucket."""
    return _document(
        [
            {"Sid": "ListModels", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn},
            {"Sid": "ReadModels", "Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{bucket_arn}/*"},
        ]
    )


def tokenizer_read_policy(bucket_arn: str, prefix: str) -> str:
    """Read the manifests and tokenizer files of the models under ``prefix`` (`fleet.protocol.model_manifest`'s
    layout, ``<prefix>/<model id>/<revision>/...``; ``*`` matches across ``/``): what `gateway.tokenizer_store`
    fetches, and no weights. No ``s3:ListBucket``: S3 then answers a missing manifest with 403, not 404, which the
    gateway's message allows for."""
    objects = [f"{bucket_arn}/{prefix}/*/{MANIFEST_NAME}"]
    objects += [f"{bucket_arn}/{prefix}/*/files/{name}" for name in TOKENIZER_FILES]
    return _document([{"Sid": "ReadTokenizers", "Effect": "Allow", "Action": "s3:GetObject", "Resource": objects}])
