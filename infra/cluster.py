"""Cluster: EKS at the stack's Kubernetes version, secrets encrypted with a KMS key, an OIDC provider for IRSA.

Access uses EKS access entries (authentication mode ``API``), one per role in ``cluster.adminRoleArns`` and
``cluster.ciRoleArns``, and nothing implicit: ``bootstrapClusterCreatorAdminPermissions`` is false, because EKS
would otherwise make an entry for the creating role itself and the program's entry for that same role (it is
listed, so a later ``up`` from another identity works) would fail with 409 ``ResourceInUseException``. So the
identity that runs the first ``pulumi up`` must be one of the listed roles. The kubeconfig uses
``aws eks get-token``.

Version policy: ``upgradePolicy.supportType`` is ``STANDARD``, so the cluster never enters paid extended support
(EKS upgrades it at the end of standard support instead). The cluster, its KMS keys and (elsewhere) the model
bucket and image repositories are ``protect``ed, and the cluster has EKS deletion protection: ``pulumi destroy``
follows the teardown in docs/cloud.md. The managed add-ons (``vpc-cni`` and ``kube-proxy`` here, ``coredns``
with the nodes, `infra.nodegroups`) run the default build EKS names for the cluster's Kubernetes version, so a
version bump upgrades them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from infra.iam import ServiceRole, irsa_managed_role, service_role

__all__ = [
    "CLUSTER_ADMIN_POLICY",
    "Cluster",
    "ClusterArgs",
    "access_entry_principals",
    "addon_version",
    "endpoint_config",
    "kubeconfig",
    "logs_key_policy",
]

CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def access_entry_principals(admin_role_arns: list[str], ci_role_arns: list[str]) -> list[tuple[str, int, str]]:
    """(kind, index, ARN) of each access entry: one per distinct role, the admin list first. A role in both
    lists gets one entry (a second would be refused as already in use)."""
    seen: set[str] = set()
    entries: list[tuple[str, int, str]] = []
    for kind, arns in (("admin", admin_role_arns), ("ci", ci_role_arns)):
        for index, arn in enumerate(arns):
            if arn not in seen:
                seen.add(arn)
                entries.append((kind, index, arn))
    return entries


def addon_version(addon: str, kubernetes_version: str) -> pulumi.Output[str]:
    """The build of ``addon`` EKS installs by default on ``kubernetes_version`` (DescribeAddonVersions)."""
    found = aws.eks.get_addon_version_output(addon_name=addon, kubernetes_version=kubernetes_version)
    return found.version


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
    kube_proxy_addon: aws.eks.Addon

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        cluster = self._cluster(name, args, tags)
        self._admin_access(name, args, cluster, tags)
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
        self._addons(name, args, cluster, tags)
        self.register_outputs({"name": cluster.name, "oidcProviderArn": self.oidc_provider.arn})

    def _cluster(self, name: str, args: ClusterArgs, tags: dict[str, str]) -> aws.eks.Cluster:
        """The EKS cluster, its secrets key, its IAM role and its control-plane log group (with its key)."""
        # Deleting a key makes what it encrypted unreadable: the keys and the cluster are protected.
        kept = pulumi.ResourceOptions(parent=self, protect=True)
        key = aws.kms.Key(
            f"{name}-secrets",
            description=f"EKS secrets envelope encryption for {args.cluster_name}",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            tags=tags,
            opts=kept,
        )
        role = service_role(f"{name}-cluster", "eks.amazonaws.com", ["AmazonEKSClusterPolicy"], self, tags)
        log_group = self._log_group(name, args, tags)
        return aws.eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=args.kubernetes_version,
            role_arn=role.arn,
            vpc_config=endpoint_config(args.subnet_ids, args.public_access_cidrs),
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": False},
            encryption_config={"provider": {"key_arn": key.arn}, "resources": ["secrets"]},
            enabled_cluster_log_types=["api", "audit", "authenticator"],
            upgrade_policy={"support_type": "STANDARD"},
            deletion_protection=True,
            tags=tags,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[*role.attachments, log_group],
                protect=True,
                # EKS reads the bootstrap flag only at creation and the provider replaces the cluster when it
                # changes: a cluster made with the old default (true) keeps it instead of being replaced.
                ignore_changes=["accessConfig.bootstrapClusterCreatorAdminPermissions"],
            ),
        )

    def _log_group(self, name: str, args: ClusterArgs, tags: dict[str, str]) -> aws.cloudwatch.LogGroup:
        """The control-plane log group and its key, made before the cluster (EKS would make one without
        encryption or expiry)."""
        kept = pulumi.ResourceOptions(parent=self, protect=True)
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
            opts=kept,
        )
        return aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=group_name,
            retention_in_days=args.log_retention_days,
            kms_key_id=logs_key.arn,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _admin_access(self, name: str, args: ClusterArgs, cluster: aws.eks.Cluster, tags: dict[str, str]) -> None:
        """An access entry with the cluster-admin policy for each admin and CI role."""
        child = pulumi.ResourceOptions(parent=self)
        for kind, index, arn in access_entry_principals(args.admin_role_arns, args.ci_role_arns):
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

    def _addons(self, name: str, args: ClusterArgs, cluster: aws.eks.Cluster, tags: dict[str, str]) -> None:
        """The VPC CNI and kube-proxy add-ons, pinned to the cluster's Kubernetes version."""
        child = pulumi.ResourceOptions(parent=self)
        # The VPC CNI (aws-node) on its own IRSA role: the node role no longer carries AmazonEKS_CNI_Policy, so
        # only aws-node may manage network interfaces. Its network policy agent enforces the NetworkPolicies.
        self.cni_role = irsa_managed_role(
            f"{name}-vpc-cni", self.oidc_provider, "kube-system", "aws-node", ["AmazonEKS_CNI_Policy"], self, tags
        )
        self.cni_addon = aws.eks.Addon(
            f"{name}-vpc-cni",
            cluster_name=cluster.name,
            addon_name="vpc-cni",
            addon_version=addon_version("vpc-cni", args.kubernetes_version),
            service_account_role_arn=self.cni_role.arn,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            configuration_values=json.dumps({"enableNetworkPolicy": "true"}),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self.cni_role.attachments),
        )
        # kube-proxy is a DaemonSet: like aws-node it is healthy before any node exists. (CoreDNS needs a node
        # to run on, so `infra.nodegroups` adds it after the CPU group.)
        self.kube_proxy_addon = aws.eks.Addon(
            f"{name}-kube-proxy",
            cluster_name=cluster.name,
            addon_name="kube-proxy",
            addon_version=addon_version("kube-proxy", args.kubernetes_version),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=tags,
            opts=child,
        )
