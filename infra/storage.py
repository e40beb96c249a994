"""Storage: the model store, an encrypted versioned private S3 bucket, and the engines' read-only IRSA role.

Engines pull weights from the bucket into the node's NVMe cache; they can read it and nothing else
(`infra.iam.model_read_policy`). Versioning keeps an overwritten model recoverable; all public access is
blocked and objects are encrypted with KMS (bucket keys keep the KMS request cost flat). The bucket is
``protect``ed: ``pulumi destroy`` stops at it instead of failing half-way on a non-empty bucket (docs/cloud.md,
"Tearing down").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from fleet import contract
from infra.iam import irsa_role, model_read_policy

__all__ = ["ModelStore", "ModelStoreArgs"]


@dataclass(frozen=True)
class ModelStoreArgs:
    environment: str
    namespace: str
    oidc_provider: aws.iam.OpenIdConnectProvider
    tags: dict[str, str] = field(default_factory=dict)


class ModelStore(pulumi.ComponentResource):
    """The model bucket with versioning, KMS encryption, no public access; the engine role reading it."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    engine_role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: ModelStoreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:ModelStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        bucket = aws.s3.Bucket(
            f"{name}-models",
            bucket_prefix=f"llmfleet-{args.environment}-models-",
            force_destroy=False,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, protect=True),
        )
        aws.s3.BucketVersioning(
            f"{name}-models", bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-models",
            bucket=bucket.id,
            rules=[
                {"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"}, "bucket_key_enabled": True}
            ],
            opts=child,
        )
        aws.s3.BucketPublicAccessBlock(
            f"{name}-models",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-models", bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child
        )
        role = irsa_role(
            f"{name}-engine",
            args.oidc_provider,
            args.namespace,
            contract.ENGINE_SERVICE_ACCOUNT,
            bucket.arn.apply(model_read_policy),
            self,
            tags,
        )
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.engine_role_arn = role.arn
        self.register_outputs({"bucket": bucket.bucket, "engineRoleArn": role.arn})
