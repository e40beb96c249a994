"""What `pulumi destroy` may not take by accident, and the egress the S3 gateway endpoint keeps off the NAT.

Destroy of a versioned bucket (BucketNotEmpty), of repositories with images (RepositoryNotEmpty) or of the keys
that encrypt the cluster's secrets and logs fails or loses data half-way: those are protected and the cluster
has EKS deletion protection (pulumi-aws `Cluster.deletion_protection`); docs/cloud.md gives the teardown order.
"""

from __future__ import annotations

import pytest

from infra.network import s3_endpoint_service
from tests.infra.conftest import stack_run
from tests.infra.registrations import registrations

KEPT = [
    "aws:eks/cluster:Cluster",
    "aws:kms/key:Key",
    "aws:s3/bucket:Bucket",
    "aws:ecr/repository:Repository",
]


def test_data_and_the_cluster_are_protected_from_destroy(monkeypatch: pytest.MonkeyPatch) -> None:
    found = registrations(monkeypatch)
    for type_token in KEPT:
        kept = found.of(type_token)
        assert kept, type_token
        assert all(options.protect for _, options in kept), type_token
    ((cluster, _),) = found.of("aws:eks/cluster:Cluster")
    assert cluster.props["deletionProtection"] is True
    # Protection is for what holds data: the rest (VPC, node groups, Kubernetes objects) goes with a destroy.
    assert not any(o.protect for r, o in found.of("aws:eks/nodeGroup:NodeGroup"))
    assert not any(o.protect for r, o in found.of("aws:ec2/vpc:Vpc"))


def test_private_subnets_reach_s3_through_a_gateway_endpoint_not_the_nat() -> None:
    run = stack_run("prod")
    (endpoint,) = run.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.props["vpcEndpointType"] == "Gateway"
    assert endpoint.props["serviceName"] == s3_endpoint_service("us-east-1") == "com.amazonaws.us-east-1.s3"
    (vpc,) = run.of_type("aws:ec2/vpc:Vpc")
    assert endpoint.props["vpcId"] == vpc.props.get("id", f"{vpc.name}-id")
    private = {r.urn for r in run.of_type("aws:ec2/routeTable:RouteTable") if "-private-" in r.name}
    assert len(private) == 3
    assert private <= set(endpoint.dependencies)  # every private route table, so every zone's nodes
    assert len(endpoint.props["routeTableIds"]) == len(private)
