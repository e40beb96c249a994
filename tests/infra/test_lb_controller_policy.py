"""The LB controller's hand-written IAM policy against upstream's for the pinned controller.

``UPSTREAM_ACTIONS`` is the set of actions in kubernetes-sigs/aws-load-balancer-controller's
docs/install/iam_policy.json at v2.14.0 (commit d847890e67b4c3a78f230bd7f7caf2bfcab01df1, what chart 1.14.0 runs;
80 actions). Ours must be a subset, and each upstream action it leaves out must be named in ``OMITTED`` with the
reason this fleet never needs it. Bumping the chart means refreshing both from the new tag.
"""

from __future__ import annotations

import json

from infra.lb_controller import LB_CONTROLLER_CHART_VERSION, lb_controller_policy

UPSTREAM_ACTIONS = frozenset(
    {
        *("acm:DescribeCertificate", "acm:ListCertificates", "cognito-idp:DescribeUserPoolClient"),
        *("ec2:AuthorizeSecurityGroupIngress", "ec2:CreateSecurityGroup", "ec2:CreateTags", "ec2:DeleteSecurityGroup"),
        *("ec2:DeleteTags", "ec2:DescribeAccountAttributes", "ec2:DescribeAddresses", "ec2:DescribeAvailabilityZones"),
        *("ec2:DescribeCoipPools", "ec2:DescribeInstances", "ec2:DescribeInternetGateways", "ec2:DescribeIpamPools"),
        *("ec2:DescribeNetworkInterfaces", "ec2:DescribeRouteTables", "ec2:DescribeSecurityGroups"),
        *("ec2:DescribeSubnets", "ec2:DescribeTags", "ec2:DescribeVpcPeeringConnections", "ec2:DescribeVpcs"),
        *("ec2:GetCoipPoolUsage", "ec2:GetSecurityGroupsForVpc", "ec2:RevokeSecurityGroupIngress"),
        *(
            f"elasticloadbalancing:{action}"
            for action in (
                *("AddListenerCertificates", "AddTags", "CreateListener", "CreateLoadBalancer", "CreateRule"),
                *("CreateTargetGroup", "DeleteListener", "DeleteLoadBalancer", "DeleteRule", "DeleteTargetGroup"),
                *("DeregisterTargets", "DescribeCapacityReservation", "DescribeListenerAttributes"),
                *("DescribeListenerCertificates", "DescribeListeners", "DescribeLoadBalancerAttributes"),
                *("DescribeLoadBalancers", "DescribeRules", "DescribeSSLPolicies", "DescribeTags"),
                *("DescribeTargetGroupAttributes", "DescribeTargetGroups", "DescribeTargetHealth"),
                *("DescribeTrustStores", "ModifyCapacityReservation", "ModifyIpPools", "ModifyListener"),
                *("ModifyListenerAttributes", "ModifyLoadBalancerAttributes", "ModifyRule", "ModifyTargetGroup"),
                *("ModifyTargetGroupAttributes", "RegisterTargets", "RemoveListenerCertificates", "RemoveTags"),
                *("SetIpAddressType", "SetRulePriorities", "SetSecurityGroups", "SetSubnets", "SetWebAcl"),
            )
        ),
        *("iam:CreateServiceLinkedRole", "iam:GetServerCertificate", "iam:ListServerCertificates"),
        *("shield:CreateProtection", "shield:DeleteProtection", "shield:DescribeProtection"),
        *("shield:GetSubscriptionState", "waf-regional:AssociateWebACL", "waf-regional:DisassociateWebACL"),
        *("waf-regional:GetWebACL", "waf-regional:GetWebACLForResource", "wafv2:AssociateWebACL"),
        *("wafv2:DisassociateWebACL", "wafv2:GetWebACL", "wafv2:GetWebACLForResource"),
    }
)

_ALB_RULES = "ALB listener rules (Ingress); an NLB listener has only its default action"
_CERT_DISCOVERY = "certificate discovery by host name (pkg/certs/cert_discovery.go); the Service names its ACM ARN"
OMITTED: dict[str, str] = {
    "acm:DescribeCertificate": _CERT_DISCOVERY,
    "acm:ListCertificates": _CERT_DISCOVERY,
    "iam:GetServerCertificate": _CERT_DISCOVERY,
    "iam:ListServerCertificates": _CERT_DISCOVERY,
    "cognito-idp:DescribeUserPoolClient": "ALB authentication with Cognito",
    "ec2:DescribeCoipPools": "Outposts customer-owned IP pools",
    "ec2:GetCoipPoolUsage": "Outposts customer-owned IP pools",
    "ec2:DescribeIpamPools": "IPAM pools for load balancer addresses (an annotation the gateway does not set)",
    "elasticloadbalancing:ModifyIpPools": "IPAM pools (pkg/deploy/elbv2/load_balancer_manager.go, only when set)",
    "ec2:DescribeVpcPeeringConnections": "no code path in v2.14.0's pkg/ calls it",
    "elasticloadbalancing:CreateRule": _ALB_RULES,
    "elasticloadbalancing:DeleteRule": _ALB_RULES,
    "elasticloadbalancing:ModifyRule": _ALB_RULES,
    "elasticloadbalancing:SetRulePriorities": _ALB_RULES,
    "elasticloadbalancing:DescribeTrustStores": "ALB mutual TLS trust stores (pkg/shared_utils/alb_listener_utils.go)",
    "elasticloadbalancing:ModifyCapacityReservation": (
        "LCU reservations: the reconciler returns early without the minimum-capacity annotation"
    ),
    "elasticloadbalancing:SetWebAcl": "WAF on ALBs",
    **{a: "Shield Advanced on ALBs" for a in UPSTREAM_ACTIONS if a.startswith("shield:")},
    **{a: "WAF on ALBs" for a in UPSTREAM_ACTIONS if a.startswith(("waf-regional:", "wafv2:"))},
}


def _actions() -> set[str]:
    document = json.loads(lb_controller_policy("llmfleet-prod", "vpc-1", "sg-1"))
    actions: set[str] = set()
    for statement in document["Statement"]:
        action = statement["Action"]
        actions.update([action] if isinstance(action, str) else action)
    return actions


def test_the_upstream_list_is_the_pinned_controllers() -> None:
    assert LB_CONTROLLER_CHART_VERSION == "1.14.0", "refresh UPSTREAM_ACTIONS from the new controller tag"
    assert len(UPSTREAM_ACTIONS) == 80


def test_every_action_is_one_upstream_grants() -> None:
    assert sorted(_actions() - UPSTREAM_ACTIONS) == []


def test_every_upstream_action_left_out_is_an_alb_or_discovery_feature_with_a_reason() -> None:
    assert sorted(UPSTREAM_ACTIONS - _actions()) == sorted(OMITTED)
    assert not set(OMITTED) & _actions()


def test_the_nlb_path_is_granted() -> None:
    nlb = {
        "elasticloadbalancing:CreateLoadBalancer",
        "elasticloadbalancing:CreateTargetGroup",
        "elasticloadbalancing:CreateListener",
        "elasticloadbalancing:ModifyListenerAttributes",
        "elasticloadbalancing:ModifyTargetGroupAttributes",
        "elasticloadbalancing:RegisterTargets",
        "elasticloadbalancing:DeregisterTargets",
        "ec2:AuthorizeSecurityGroupIngress",
    }
    assert nlb <= _actions()
