"""Cluster hardening rules: node instance metadata out of pods' reach, and no Kubernetes API open to the internet."""

from __future__ import annotations

import ipaddress

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from policies.common import LAUNCH_TEMPLATE, as_int, get_path, mapping, sequence

__all__ = ["EKS_CLUSTER", "cluster_endpoint_restricted", "imds_hop_limit_one", "open_cidrs"]

EKS_CLUSTER = "aws:eks/cluster:Cluster"


def imds_hop_limit_one_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != LAUNCH_TEMPLATE:
        return
    options = mapping(args.props.get("metadataOptions"))
    tokens = str(options.get("httpTokens") or "optional")
    hops = as_int(options.get("httpPutResponseHopLimit"))
    if str(options.get("httpEndpoint") or "enabled") == "disabled":
        return  # no metadata service at all
    if tokens != "required" or hops != 1:
        report_violation(
            f"launch template {args.name!r} serves instance metadata with httpTokens {tokens!r} and hop limit "
            f"{hops if hops is not None else 'default'}; required: httpTokens 'required', hop limit 1. Risk: any "
            "pod on the node reads the node role's credentials from IMDS and acts as the node (pull every image, "
            "attach network interfaces, describe the account).",
            None,
        )


def open_cidrs(cidrs: object) -> list[str]:
    """The CIDRs among ``cidrs`` that admit every address (a /0), or unreadable ones."""
    found = []
    for cidr in sequence(cidrs):
        try:
            if ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0:
                found.append(str(cidr))
        except ValueError:
            found.append(str(cidr))
    return found


def cluster_endpoint_restricted_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != EKS_CLUSTER:
        return
    vpc = mapping(args.props.get("vpcConfig"))
    public = vpc.get("endpointPublicAccess")
    if public is False or str(public).lower() == "false":
        return
    cidrs = get_path(vpc, "publicAccessCidrs")
    # EKS opens a public endpoint with no CIDR list to 0.0.0.0/0.
    wide = open_cidrs(cidrs) if sequence(cidrs) else ["0.0.0.0/0 (no publicAccessCidrs)"]
    if wide:
        report_violation(
            f"EKS cluster {args.name!r} has a public API endpoint open to {', '.join(wide)}. Risk: the Kubernetes "
            "API faces every scanner on the internet; a leaked kubeconfig token or an API server flaw is exploitable "
            "from anywhere. List the office/VPN/CI ranges in cluster.publicEndpointCidrs, or none.",
            None,
        )


imds_hop_limit_one = ResourceValidationPolicy(
    name="imds-hop-limit-one",
    description="Every launch template requires IMDSv2 tokens with a hop limit of 1 (pods cannot reach IMDS).",
    validate=imds_hop_limit_one_validator,
)

cluster_endpoint_restricted = ResourceValidationPolicy(
    name="cluster-endpoint-restricted",
    description="The EKS API endpoint is private, or public only to listed CIDRs (never 0.0.0.0/0).",
    validate=cluster_endpoint_restricted_validator,
)
