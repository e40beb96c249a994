"""Cluster: EKS at the stack's Kubernetes version, secrets encrypted with a KMS key, an OIDC provider for IRSA.

Access uses EKS access entries (authentication mode ``API``); the identity running ``pulumi up`` gets admin
through ``bootstrapClusterCreatorAdminPermissions``. The kubeconfig uses ``aws eks get-token``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from infra.iam import ServiceRole, irsa_managed_role, service_role

__all__ = ["CLUSTER_ADMIN_POLICY", "Cluster", "ClusterArgs", "endpoint_config", "kubeconfig", "logs_key_policy"]

CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def logs_key_policy(account_id: str, partition: str, region: str, log_group_arn: str) -> str:
    """The control-plane log key's policy: the account administers it; CloudWatch Logs uses it for this group."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "AccountAdministers",
                    "Effect": "Allow",
                    "Principal": {"AWS": f"arn:{partition}:iam::{account_id}:root"},
                    "Action": "kms:*",
                    "Resource": "*",
                },
                {
                    "Sid": "LogsEncryptThisGroup",
                    "Effect": "Allow",
                    "Principal": {"Service": f"logs.{region}.amazonaws.com"},
                    "Action": [
                        "kms:Encrypt*",
                        "kms:Decrypt*",
                        "kms:ReEncrypt*",
                        "kms:GenerateDataKey*",
                        "kms:Describe*",
                    ],
                    "Resource": "*",
                    "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": log_group_arn}},
                },
            ],
        },
        sort_keys=True,
    )


@dataclass(frozen=True)
class ClusterArgs:
    cluster_name: str
    kubernetes_version: str
    subnet_ids: list[pulumi.Output[str]]
    region: str
    public_access_cidrs: list[str] = field(default_factory=list)  # empty: no public endpoint
    admin_role_arns: list[str] = field(default_factory=list)  # cluster admins through access entries
    ci_role_arns: list[str] = field(default_factory=list)  # the CI's `pulumi up` roles, cluster admins too
    log_retention_days: int = 90
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
    cni_role: ServiceRole
    cni_addon: aws.eks.Addon  # node groups wait for it: a node turns Ready once aws-node runs

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
        # The control-plane log group, made before the cluster (EKS would make one without encryption or expiry).
        identity = aws.get_caller_identity_output()
        partition = aws.get_partition_output()
        group_name = f"/aws/eks/{args.cluster_name}/cluster"
        logs_key = aws.kms.Key(
            f"{name}-logs",
            description=f"EKS control-plane log encryption for {args.cluster_name}",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=pulumi.Output.all(identity.account_id, partition.partition).apply(
                lambda v: logs_key_policy(
                    str(v[0]),
                    str(v[1]),
                    args.region,
                    f"arn:{v[1]}:logs:{args.region}:{v[0]}:log-group:{group_name}",
                )
            ),
            tags=tags,
            opts=child,
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=group_name,
            retention_in_days=args.log_retention_days,
            kms_key_id=logs_key.arn,
            tags=tags,
            opts=child,
        )
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
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*role.attachments, log_group]),
        )
        for kind, arns in (("admin", args.admin_role_arns), ("ci", args.ci_role_arns)):
            for index, arn in enumerate(arns):
                entry = aws.eks.AccessEntry(
                    f"{name}-{kind}-{index}",
                    cluster_name=cluster.name,
                    principal_arn=arn,
                    type="STANDARD",
                    tags=tags,
                    opts=child,
                )
                aws.eks.AccessPolicyAssociation(
                    f"{name}-{kind}-{index}",
                    cluster_name=cluster.name,
                    principal_arn=entry.principal_arn,
                    policy_arn=CLUSTER_ADMIN_POLICY,
                    access_scope={"type": "cluster"},
                    opts=child,
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
        # The VPC CNI (aws-node) on its own IRSA role: the node role no longer carries AmazonEKS_CNI_Policy, so
        # only aws-node may manage network interfaces. Its network policy agent enforces the NetworkPolicies.
        self.cni_role = irsa_managed_role(
            f"{name}-vpc-cni", self.oidc_provider, "kube-system", "aws-node", ["AmazonEKS_CNI_Policy"], self, tags
        )
        self.cni_addon = aws.eks.Addon(
            f"{name}-vpc-cni",
            cluster_name=cluster.name,
            addon_name="vpc-cni",
            service_account_role_arn=self.cni_role.arn,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            configuration_values=json.dumps({"enableNetworkPolicy": "true"}),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self.cni_role.attachments),
        )
        self.register_outputs({"name": cluster.name, "oidcProviderArn": self.oidc_provider.arn})
