"""Storage: the model store, an encrypted versioned private S3 bucket, and the IRSA roles that read it.

Engines pull weights from the bucket into the node's NVMe cache; they can read it and nothing else
(`infra.iam.model_read_policy`). Gateways fetch the tokenizers of the pools they route by ``kv-cache``; they can
read only the manifests and tokenizer files under the stack's ``modelStore.prefix``
(`infra.iam.tokenizer_read_policy`). Versioning keeps an overwritten model recoverable; all public access is
blocked, a bucket policy denies every request not made over TLS, and objects are encrypted with KMS (bucket keys
keep the KMS request cost flat). The bucket is ``protect``ed: ``pulumi destroy`` stops at it instead of failing
half-way on a non-empty bucket (docs/cloud.md, "Tearing down").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from fleet.protocol import contract
from infra.iam import irsa_role, model_read_policy, tokenizer_read_policy

__all__ = ["ModelStore", "ModelStoreArgs", "tls_only_policy"]


def tls_only_policy(bucket_arn: str) -> str:
    """The bucket policy: every request that is not over TLS is denied, to everyone, on the bucket and its
    objects (S3 accepts plain HTTP unless a policy denies it; the engines and ``llmfleet model push`` use HTTPS)."""
    statement = {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket_arn, f"{bucket_arn}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


@dataclass(frozen=True)
class ModelStoreArgs:
    environment: str
    namespace: str
    oidc_provider: aws.iam.OpenIdConnectProvider
    tags: dict[str, str] = field(default_factory=dict)
    prefix: str = "models"  # the stack's modelStore.prefix: where the gateway role may read


class ModelStore(pulumi.ComponentResource):
    """The model bucket with versioning, KMS encryption, no public access; the engine and gateway roles reading it."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    engine_role_arn: pulumi.Output[str]
    gateway_role_arn: pulumi.Output[str]

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
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-models",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        ownership = aws.s3.BucketOwnershipControls(
            f"{name}-models", bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child
        )
        aws.s3.BucketPolicy(
            f"{name}-models",
            bucket=bucket.id,
            policy=bucket.arn.apply(tls_only_policy),
            # After the other bucket settings: S3 answers concurrent changes of one bucket's policy, public access
            # block and ownership with 409 OperationAborted (hashicorp/terraform-provider-aws#7628).
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access, ownership]),
        )
        engine, gateway = self._readers(name, args, bucket.arn)
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.engine_role_arn = engine.arn
        self.gateway_role_arn = gateway.arn
        self.register_outputs({"bucket": bucket.bucket, "engineRoleArn": engine.arn, "gatewayRoleArn": gateway.arn})

    def _readers(
        self, name: str, args: ModelStoreArgs, bucket_arn: pulumi.Output[str]
    ) -> tuple[aws.iam.Role, aws.iam.Role]:
        """The IRSA roles reading the bucket: the engines' (every object), the gateways' (manifests, tokenizers)."""
        engine = irsa_role(
            f"{name}-engine",
            args.oidc_provider,
            args.namespace,
            contract.ENGINE_SERVICE_ACCOUNT,
            bucket_arn.apply(model_read_policy),
            self,
            args.tags,
        )
        gateway = irsa_role(
            f"{name}-gateway",
            args.oidc_provider,
            args.namespace,
            contract.GATEWAY_NAME,
            bucket_arn.apply(lambda arn: tokenizer_read_policy(arn, args.prefix)),
            self,
            args.tags,
        )
        return engine, gateway
