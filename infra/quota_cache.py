"""Quota cache: the ElastiCache Redis the gateways share tenant quotas through, on the ``aws`` target.

One replication group (Redis OSS 7.1, cluster mode off) with a primary and one replica in different zones:
Multi-AZ with automatic failover, so losing the primary's zone costs seconds of quota checks, not the quotas
(a one-zone stack gets a single node).
Encrypted at rest and in transit; clients authenticate with an auth token from a Pulumi secret
(``gateway.redis.authTokenSecret``). The nodes sit in the private subnets behind a security group that admits
only the cluster security group (every node, hence every gateway pod) on 6379, and nothing else.

Quota counters live seconds to minutes, so there are no snapshots. `url` is the ``rediss://`` URL the gateway
connects with (a secret: it carries the token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

import pulumi
import pulumi_aws as aws

__all__ = ["REDIS_PORT", "QuotaCache", "QuotaCacheArgs", "check_auth_token", "redis_tls_url"]

REDIS_PORT = 6379
_FORBIDDEN = set('/"@')


def check_auth_token(token: str, secret_key: str) -> str:
    """The token, if ElastiCache accepts it: 16 to 128 printable ASCII characters, none of ``/ " @``."""
    if not 16 <= len(token) <= 128 or not all(c.isascii() and c.isprintable() for c in token):
        raise ValueError(f"config {secret_key}: the Redis auth token must be 16 to 128 printable ASCII characters")
    if _FORBIDDEN & set(token) or " " in token:
        raise ValueError(f"config {secret_key}: the Redis auth token may not contain '/', '\"', '@' or spaces")
    return token


def redis_tls_url(host: str, token: str, port: int = REDIS_PORT) -> str:
    """``rediss://:<token>@host:port/0``, the token percent-encoded so any allowed character survives."""
    return f"rediss://:{quote(token, safe='')}@{host}:{port}/0"


@dataclass(frozen=True)
class QuotaCacheArgs:
    environment: str
    node_type: str
    vpc_id: pulumi.Input[str]
    subnet_ids: dict[str, pulumi.Output[str]]  # zone -> private subnet
    client_security_group_id: pulumi.Input[str]  # the only group admitted on the Redis port
    auth_token: pulumi.Input[str]  # secret
    auth_token_secret: str  # the config key it came from, for error messages
    tags: dict[str, str] = field(default_factory=dict)


class QuotaCache(pulumi.ComponentResource):
    """Security group, subnet group and the Multi-AZ replication group; ``url`` (secret) to connect."""

    group: aws.elasticache.ReplicationGroup
    url: pulumi.Output[str]

    def __init__(self, name: str, args: QuotaCacheArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:QuotaCache", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        zones = sorted(args.subnet_ids)
        # A one-zone stack (dev clusters, tests) gets one node: failover needs a replica in another zone.
        multi_az = len(zones) >= 2
        security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=args.vpc_id,
            description=f"llmfleet {args.environment} quota Redis: gateways only",
            tags={**args.tags, "Name": f"llmfleet-{args.environment}-quota-redis"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-from-nodes",
            security_group_id=security_group.id,
            referenced_security_group_id=args.client_security_group_id,
            ip_protocol="tcp",
            from_port=REDIS_PORT,
            to_port=REDIS_PORT,
            description="Redis from the cluster's nodes (gateway pods)",
            opts=child,
        )
        subnets = aws.elasticache.SubnetGroup(
            f"{name}-subnets",
            subnet_ids=[args.subnet_ids[z] for z in zones],
            description=f"llmfleet {args.environment} quota Redis (private subnets)",
            tags=args.tags,
            opts=child,
        )
        token = pulumi.Output.secret(args.auth_token).apply(lambda t: check_auth_token(t, args.auth_token_secret))
        self.group = aws.elasticache.ReplicationGroup(
            f"{name}-redis",
            description=f"llmfleet {args.environment} tenant quotas",
            engine="redis",
            engine_version="7.1",
            parameter_group_name="default.redis7",
            node_type=args.node_type,
            num_cache_clusters=2 if multi_az else 1,
            preferred_cache_cluster_azs=zones[:2],
            automatic_failover_enabled=multi_az,
            multi_az_enabled=multi_az,
            at_rest_encryption_enabled=True,
            transit_encryption_enabled=True,
            auth_token=token,
            port=REDIS_PORT,
            subnet_group_name=subnets.name,
            security_group_ids=[security_group.id],
            snapshot_retention_limit=0,
            auto_minor_version_upgrade=True,
            tags=args.tags,
            opts=child,
        )
        self.url = pulumi.Output.secret(
            pulumi.Output.all(self.group.primary_endpoint_address, token).apply(
                lambda v: redis_tls_url(str(v[0]), str(v[1]))
            )
        )
        self.register_outputs({"primaryEndpoint": self.group.primary_endpoint_address})
