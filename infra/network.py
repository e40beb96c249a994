"""Network: a VPC with a public and a private subnet in each availability zone and one NAT gateway per zone.

Nodes live in the private subnets; the public subnets hold only the NAT gateways and internet-facing load
balancers (tagged ``kubernetes.io/role/elb``). One NAT per zone keeps a zone's egress independent of the
others: losing a zone never cuts the surviving zones off from S3, ECR or the model hub.

An S3 gateway endpoint sits on every private route table: weight fetches from the model bucket and ECR's image
layers (which ECR serves from S3) then bypass the NAT gateways and their per-GB processing charge; a gateway
endpoint itself is free. Interface endpoints (ECR's API, STS) cost per zone-hour and carry little traffic here,
so there are none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

__all__ = ["Network", "NetworkArgs", "s3_endpoint_service", "subnet_cidrs"]


def s3_endpoint_service(region: str) -> str:
    """The S3 gateway endpoint's service name in ``region``."""
    return f"com.amazonaws.{region}.s3"


def subnet_cidrs(index: int) -> tuple[str, str]:
    """(public, private) CIDRs of the zone at ``index`` in 10.0.0.0/16: a /21 public, a /19 private (<= 6 zones)."""
    if not 0 <= index < 6:
        raise ValueError("at most 6 availability zones")
    return f"10.0.{192 + 8 * index}.0/21", f"10.0.{32 * index}.0/19"


@dataclass(frozen=True)
class NetworkArgs:
    cluster_name: str
    zones: list[str]
    tags: dict[str, str] = field(default_factory=dict)
    region: str | None = None  # None: the provider's region (aws:region)


class Network(pulumi.ComponentResource):
    """VPC, internet gateway, and per zone: public subnet, EIP + NAT gateway, private subnet and route table."""

    vpc_id: pulumi.Output[str]
    public_subnet_ids: dict[str, pulumi.Output[str]]
    private_subnet_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block="10.0.0.0/16",
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={**tags, "Name": f"{name}-vpc"},
            opts=child,
        )
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tags, opts=child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}],
            tags={**tags, "Name": f"{name}-public"},
            opts=child,
        )
        self.public_subnet_ids = {}
        self.private_subnet_ids = {}
        private_route_tables: list[pulumi.Output[str]] = []
        for index, zone in enumerate(args.zones):
            public, private, private_rt = self._zone(name, args, index, zone, vpc, igw, public_rt)
            private_route_tables.append(private_rt.id)
            self.public_subnet_ids[zone] = public.id
            self.private_subnet_ids[zone] = private.id
        # The stack's region: the one given, else the provider's own setting (aws:region), else the provider's.
        region: pulumi.Input[str] = args.region or pulumi.Config("aws").get("region") or aws.get_region_output().region
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=pulumi.Output.from_input(region).apply(s3_endpoint_service),
            vpc_endpoint_type="Gateway",
            route_table_ids=private_route_tables,
            tags={**tags, "Name": f"{name}-s3"},
            opts=child,
        )
        self.vpc_id = vpc.id
        self.register_outputs(
            {
                "vpcId": vpc.id,
                "publicSubnetIds": list(self.public_subnet_ids.values()),
                "privateSubnetIds": list(self.private_subnet_ids.values()),
            }
        )

    def _zone(
        self,
        name: str,
        args: NetworkArgs,
        index: int,
        zone: str,
        vpc: aws.ec2.Vpc,
        igw: aws.ec2.InternetGateway,
        public_rt: aws.ec2.RouteTable,
    ) -> tuple[aws.ec2.Subnet, aws.ec2.Subnet, aws.ec2.RouteTable]:
        """One zone's public subnet (on the public route table), EIP and NAT gateway, private subnet and its route
        table (through that NAT): (public subnet, private subnet, private route table)."""
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        shared = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}
        public_cidr, private_cidr = subnet_cidrs(index)
        public = aws.ec2.Subnet(
            f"{name}-public-{zone}",
            vpc_id=vpc.id,
            cidr_block=public_cidr,
            availability_zone=zone,
            map_public_ip_on_launch=False,
            tags={**tags, **shared, "Name": f"{name}-public-{zone}", "kubernetes.io/role/elb": "1"},
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-public-{zone}", subnet_id=public.id, route_table_id=public_rt.id, opts=child
        )
        eip = aws.ec2.Eip(f"{name}-nat-{zone}", domain="vpc", tags=tags, opts=child)
        nat = aws.ec2.NatGateway(
            f"{name}-nat-{zone}",
            allocation_id=eip.id,
            subnet_id=public.id,
            tags={**tags, "Name": f"{name}-nat-{zone}"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
        )
        private = aws.ec2.Subnet(
            f"{name}-private-{zone}",
            vpc_id=vpc.id,
            cidr_block=private_cidr,
            availability_zone=zone,
            tags={**tags, **shared, "Name": f"{name}-private-{zone}", "kubernetes.io/role/internal-elb": "1"},
            opts=child,
        )
        private_rt = aws.ec2.RouteTable(
            f"{name}-private-{zone}",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
            tags={**tags, "Name": f"{name}-private-{zone}"},
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-private-{zone}", subnet_id=private.id, route_table_id=private_rt.id, opts=child
        )
        return public, private, private_rt
