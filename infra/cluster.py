"""Cluster: EKS at the stack's Kubernetes version, secrets encrypted with a KMS key, an OIDC provider for IRSA.

Access uses EKS access entries (authentication mode ``API``); the identity running ``pulumi up`` gets admin
through ``bootstrapClusterCreatorAdminPermissions``. The kubeconfig uses ``aws eks get-token``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from infra.iam import service_role

__all__ = ["Cluster", "ClusterArgs", "endpoint_config", "kubeconfig"]


@dataclass(frozen=True)
class ClusterArgs:
    cluster_name: str
    kubernetes_version: str
    subnet_ids: list[pulumi.Output[str]]
    region: str
    public_access_cidrs: list[str] = field(default_factory=list)  # empty: no public endpoint
    tags: dict[str, str] = field(default_factory=dict)


def endpoint_config(
    subnet_ids: list[pulumi.Output[str]], public_access_cidrs: list[str]
) -> aws.eks.ClusterVpcConfigArgsDict:
    """The cluster's ``vpc_config``: the private endpoint always; the public one only for the listed CIDRs."""
    config: aws.eks.ClusterVpcConfigArgsDict = {
        "subnet_ids": list(subnet_ids),
        "endpoint_private_access": True,
        "endpoint_public_access": bool(public_access_cidrs),
    }
    if public_access_cidrs:
        config["public_access_cidrs"] = list(public_access_cidrs)
    return config


def kubeconfig(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig (JSON) that authenticates with ``aws eks get-token``."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
            "users": [
                {
                    "name": name,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "aws",
                            "args": ["eks", "get-token", "--cluster-name", name, "--region", region],
                        }
                    },
                }
            ],
        }
    )


class Cluster(pulumi.ComponentResource):
    """The EKS control plane, its KMS key, its IAM role and its IRSA OIDC provider."""

    name: pulumi.Output[str]
    arn: pulumi.Output[str]
    oidc_provider: aws.iam.OpenIdConnectProvider
    kubeconfig: pulumi.Output[str]
    security_group_id: pulumi.Output[str]  # the EKS-made cluster security group; every managed node carries it

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        key = aws.kms.Key(
            f"{name}-secrets",
            description=f"EKS secrets envelope encryption for {args.cluster_name}",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            tags=tags,
            opts=child,
        )
        role = service_role(f"{name}-cluster", "eks.amazonaws.com", ["AmazonEKSClusterPolicy"], self, tags)
        cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=args.kubernetes_version,
            role_arn=role.arn,
            vpc_config=endpoint_config(args.subnet_ids, args.public_access_cidrs),
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": True},
            encryption_config={"provider": {"key_arn": key.arn}, "resources": ["secrets"]},
            enabled_cluster_log_types=["api", "audit", "authenticator"],
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=role.attachments),
        )
        issuer = cluster.identities.apply(lambda ids: ids[0].oidcs[0].issuer if ids and ids[0].oidcs else "")
        self.oidc_provider = aws.iam.OpenIdConnectProvider(
            f"{name}-oidc", url=issuer, client_id_lists=["sts.amazonaws.com"], tags=tags, opts=child
        )
        self.name = cluster.name
        self.arn = cluster.arn
        self.security_group_id = cluster.vpc_config.cluster_security_group_id
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority.data).apply(
                lambda v: kubeconfig(str(v[0]), str(v[1]), str(v[2]), args.region)
            )
        )
        self.register_outputs({"name": cluster.name, "oidcProviderArn": self.oidc_provider.arn})
