"""LB controller: the AWS Load Balancer Controller, which turns the gateway's LoadBalancer Service into an NLB.

Without it the Kubernetes in-tree AWS provider handles every LoadBalancer Service: no pod-IP targets, no
target group attributes, no readiness gates. The controller reconciles Services annotated
``aws-load-balancer-type: external`` (see `infra.gateway_tier.gateway_service_annotations`): an NLB whose
targets are pod IPs, internet-facing or internal, with listener and target group attributes from annotations
(a TLS listener takes none: pkg/deploy/elbv2/listener_manager.go leaves TLS out of the protocols with listener
attributes, and its 350 s idle timeout is fixed).

Its Service webhook (``mservice.elbv2.k8s.aws``) sees every Service created in the cluster and, in chart 1.14.0,
fails closed (aws/eks-charts stable/aws-load-balancer-controller/values.yaml
``serviceMutatorWebhookConfig.failurePolicy: Fail``): while the controller has no endpoints, creating a Service
fails with ``no endpoints available``. So every Service the program creates (and the metrics-server chart)
waits for the release, and the webhook is set to fail open (``Ignore``): a Service created while both
controller pods are down, on a later day, is created unmutated; the gateway's ``type: external`` annotation
still hands it to the controller. The pod webhook (readiness gates) fails open too.

Its IRSA role gets `lb_controller_policy`, written for what this fleet asks of it (NLBs only, no ALB, WAF,
Shield or Cognito): read the VPC and load balancers; create load balancers, target groups and security groups
only when they carry ``elbv2.k8s.aws/cluster=<this cluster>``, and change or delete only those; register pod
targets; open the node security group to its own load balancers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.iam import irsa_role

__all__ = [
    "LB_CONTROLLER_CHART_VERSION",
    "LB_CONTROLLER_REPO",
    "LB_CONTROLLER_SERVICE_ACCOUNT",
    "LoadBalancerController",
    "LoadBalancerControllerArgs",
    "lb_controller_policy",
]

# 1.14.0 ships controller v2.14.0; NLB listener attributes (the idle timeout) need v2.9 or later.
LB_CONTROLLER_CHART_VERSION = "1.14.0"
LB_CONTROLLER_REPO = "https://aws.github.io/eks-charts"
LB_CONTROLLER_SERVICE_ACCOUNT = "aws-load-balancer-controller"
_NAMESPACE = "kube-system"
_OWNER_TAG = "elbv2.k8s.aws/cluster"  # the controller stamps it on everything it creates; value: cluster name
_ELB = "elasticloadbalancing"
_SECURITY_GROUPS = "arn:aws:ec2:*:*:security-group/*"
_TARGET_GROUPS = "arn:aws:elasticloadbalancing:*:*:targetgroup/*/*"
_NLBS = "arn:aws:elasticloadbalancing:*:*:loadbalancer/net/*/*"
_NLB_LISTENERS = "arn:aws:elasticloadbalancing:*:*:listener/net/*/*/*"

_READ_ACTIONS = [
    "ec2:DescribeAccountAttributes",
    "ec2:DescribeAddresses",
    "ec2:DescribeAvailabilityZones",
    "ec2:DescribeInstances",
    "ec2:DescribeInternetGateways",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeRouteTables",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
    "ec2:DescribeTags",
    "ec2:DescribeVpcs",
    "ec2:GetSecurityGroupsForVpc",
    f"{_ELB}:DescribeCapacityReservation",
    f"{_ELB}:DescribeListenerAttributes",
    f"{_ELB}:DescribeListenerCertificates",
    f"{_ELB}:DescribeListeners",
    f"{_ELB}:DescribeLoadBalancerAttributes",
    f"{_ELB}:DescribeLoadBalancers",
    f"{_ELB}:DescribeRules",
    f"{_ELB}:DescribeSSLPolicies",
    f"{_ELB}:DescribeTags",
    f"{_ELB}:DescribeTargetGroupAttributes",
    f"{_ELB}:DescribeTargetGroups",
    f"{_ELB}:DescribeTargetHealth",
]


def lb_controller_policy(cluster_name: str, vpc_id: str, node_security_group_id: str) -> str:
    """What the controller needs to run this cluster's NLBs, scoped by the ownership tag to this cluster.

    ``node_security_group_id`` is the security group of the nodes (and so of the pods): the controller opens
    it to its load balancers' traffic, and may touch no other group it did not create. The TLS listener names its
    certificate (``aws-load-balancer-ssl-cert``), so no ACM call is needed: the controller calls ACM only to
    discover certificates by host name (Ingress). Every action is in upstream's docs/install/iam_policy.json for
    the pinned controller; what upstream has and this omits (ALB rules, WAF, Shield, Cognito, certificate
    discovery, Outposts and IPAM pools) is listed, with why, in tests/infra/test_lb_controller_policy.py.
    """
    tags = _OwnerConditions(cluster_name)
    statements: list[dict[str, Any]] = [
        {
            "Sid": "ElbServiceLinkedRole",
            "Effect": "Allow",
            "Action": "iam:CreateServiceLinkedRole",
            "Resource": "*",
            "Condition": {"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}},
        },
        {"Sid": "ReadNetworkAndLoadBalancers", "Effect": "Allow", "Action": _READ_ACTIONS, "Resource": "*"},
        *_security_group_statements(tags, vpc_id, node_security_group_id),
        *_load_balancer_statements(tags),
        *_listener_and_target_statements(),
    ]
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


class _OwnerConditions:
    """IAM conditions on the ownership tag: a request tagging for this cluster, a resource tagged for it, and a
    resource tagged for it whose request leaves the tag alone."""

    def __init__(self, cluster_name: str) -> None:
        self.requested = {"StringEquals": {f"aws:RequestTag/{_OWNER_TAG}": cluster_name}}
        self.owned = {"StringEquals": {f"aws:ResourceTag/{_OWNER_TAG}": cluster_name}}
        self.owned_keep_tag = {**self.owned, "Null": {f"aws:RequestTag/{_OWNER_TAG}": "true"}}


def _security_group_statements(
    tags: _OwnerConditions, vpc_id: str, node_security_group_id: str
) -> list[dict[str, Any]]:
    """Create security groups in this VPC tagged for this cluster, manage only those; open the nodes' group."""
    requested, owned, owned_keep_tag = tags.requested, tags.owned, tags.owned_keep_tag
    return [
        {
            "Sid": "SecurityGroupsInThisVpc",
            "Effect": "Allow",
            "Action": "ec2:CreateSecurityGroup",
            "Resource": f"arn:aws:ec2:*:*:vpc/{vpc_id}",
        },
        {
            "Sid": "CreateOwnedSecurityGroups",
            "Effect": "Allow",
            "Action": "ec2:CreateSecurityGroup",
            "Resource": _SECURITY_GROUPS,
            "Condition": requested,
        },
        {
            "Sid": "TagSecurityGroupsOnCreate",
            "Effect": "Allow",
            "Action": "ec2:CreateTags",
            "Resource": _SECURITY_GROUPS,
            "Condition": {"StringEquals": {"ec2:CreateAction": "CreateSecurityGroup", **requested["StringEquals"]}},
        },
        {
            "Sid": "ManageOwnedSecurityGroups",
            "Effect": "Allow",
            "Action": [
                "ec2:AuthorizeSecurityGroupIngress",
                "ec2:RevokeSecurityGroupIngress",
                "ec2:DeleteSecurityGroup",
            ],
            "Resource": _SECURITY_GROUPS,
            "Condition": owned,
        },
        {
            "Sid": "RetagOwnedSecurityGroups",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags", "ec2:DeleteTags"],
            "Resource": _SECURITY_GROUPS,
            "Condition": owned_keep_tag,
        },
        {
            "Sid": "OpenNodesToLoadBalancers",
            "Effect": "Allow",
            "Action": ["ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress"],
            "Resource": f"arn:aws:ec2:*:*:security-group/{node_security_group_id}",
        },
    ]


def _load_balancer_statements(tags: _OwnerConditions) -> list[dict[str, Any]]:
    """Create NLBs and target groups tagged for this cluster, and manage only those."""
    requested, owned, owned_keep_tag = tags.requested, tags.owned, tags.owned_keep_tag
    return [
        {
            "Sid": "CreateOwnedLoadBalancers",
            "Effect": "Allow",
            "Action": [f"{_ELB}:CreateLoadBalancer", f"{_ELB}:CreateTargetGroup"],
            "Resource": "*",
            "Condition": requested,
        },
        {
            "Sid": "TagLoadBalancersOnCreate",
            "Effect": "Allow",
            "Action": f"{_ELB}:AddTags",
            "Resource": [_TARGET_GROUPS, _NLBS, _NLB_LISTENERS],
            "Condition": {
                "StringEquals": {f"{_ELB}:CreateAction": ["CreateTargetGroup", "CreateLoadBalancer", "CreateListener"]}
            },
        },
        {
            "Sid": "ManageOwnedLoadBalancers",
            "Effect": "Allow",
            "Action": [
                f"{_ELB}:CreateListener",
                f"{_ELB}:DeleteLoadBalancer",
                f"{_ELB}:DeleteTargetGroup",
                f"{_ELB}:ModifyLoadBalancerAttributes",
                f"{_ELB}:ModifyTargetGroup",
                f"{_ELB}:ModifyTargetGroupAttributes",
                f"{_ELB}:SetIpAddressType",
                f"{_ELB}:SetSecurityGroups",
                f"{_ELB}:SetSubnets",
            ],
            "Resource": "*",
            "Condition": owned,
        },
        {
            "Sid": "RetagOwnedLoadBalancers",
            "Effect": "Allow",
            "Action": [f"{_ELB}:AddTags", f"{_ELB}:RemoveTags"],
            "Resource": [_TARGET_GROUPS, _NLBS, _NLB_LISTENERS],
            "Condition": owned_keep_tag,
        },
    ]


def _listener_and_target_statements() -> list[dict[str, Any]]:
    """Change the NLBs' listeners; register pod targets."""
    return [
        {
            "Sid": "ManageNlbListeners",
            "Effect": "Allow",
            "Action": [
                f"{_ELB}:AddListenerCertificates",
                f"{_ELB}:DeleteListener",
                f"{_ELB}:ModifyListener",
                f"{_ELB}:ModifyListenerAttributes",
                f"{_ELB}:RemoveListenerCertificates",
            ],
            "Resource": _NLB_LISTENERS,
        },
        {
            "Sid": "RegisterPodTargets",
            "Effect": "Allow",
            "Action": [f"{_ELB}:RegisterTargets", f"{_ELB}:DeregisterTargets"],
            "Resource": _TARGET_GROUPS,
        },
    ]


@dataclass(frozen=True)
class LoadBalancerControllerArgs:
    cluster_name: pulumi.Input[str]
    region: str
    vpc_id: pulumi.Input[str]
    node_security_group_id: pulumi.Input[str]
    oidc_provider: aws.iam.OpenIdConnectProvider
    node_selector: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


class LoadBalancerController(pulumi.ComponentResource):
    """The controller's IRSA role and its Helm release in ``kube-system`` (two replicas)."""

    release: k8s.helm.v3.Release
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: LoadBalancerControllerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:LoadBalancerController", name, None, opts)
        policy = pulumi.Output.all(args.cluster_name, args.vpc_id, args.node_security_group_id).apply(
            lambda v: lb_controller_policy(str(v[0]), str(v[1]), str(v[2]))
        )
        role = irsa_role(
            f"{name}-role", args.oidc_provider, _NAMESPACE, LB_CONTROLLER_SERVICE_ACCOUNT, policy, self, args.tags
        )
        values: dict[str, Any] = {
            "clusterName": args.cluster_name,
            "region": args.region,
            "vpcId": args.vpc_id,
            "replicaCount": 2,
            # Fail open: see the module docstring (chart 1.14.0 defaults the Service webhook to Fail).
            "serviceMutatorWebhookConfig": {"failurePolicy": "Ignore"},
            "podMutatorWebhookConfig": {"failurePolicy": "Ignore"},
            "serviceAccount": {
                "create": True,
                "name": LB_CONTROLLER_SERVICE_ACCOUNT,
                "annotations": {"eks.amazonaws.com/role-arn": role.arn},
            },
        }
        if args.node_selector:
            values["nodeSelector"] = dict(args.node_selector)
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            k8s.helm.v3.ReleaseArgs(
                name="aws-load-balancer-controller",
                chart="aws-load-balancer-controller",
                version=LB_CONTROLLER_CHART_VERSION,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=LB_CONTROLLER_REPO),
                namespace=_NAMESPACE,
                values=values,
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.role_arn = role.arn
        self.register_outputs({"release": self.release.name, "roleArn": role.arn})
