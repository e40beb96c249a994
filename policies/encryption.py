"""Encryption rules: model buckets, node volumes and Kubernetes secrets are encrypted at rest."""

from __future__ import annotations

from pulumi_policy import (
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from policies.common import LAUNCH_TEMPLATE, NODE_GROUP, get_path, mapping, sequence

__all__ = ["buckets_encrypted", "cluster_secrets_encrypted", "volumes_encrypted"]

_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)


def _true(value: object) -> bool:
    return value is True or str(value).lower() == "true"


def buckets_encrypted_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    encrypted: set[str] = set()
    for resource in args.resources:
        if resource.resource_type in _SSE:
            rules = [mapping(r) for r in sequence(resource.props.get("rules"))]
            if any(get_path(r, "applyServerSideEncryptionByDefault", "sseAlgorithm") for r in rules):
                encrypted.add(str(resource.props.get("bucket")))
    for resource in args.resources:
        if resource.resource_type not in _BUCKETS:
            continue
        inline = resource.props.get("serverSideEncryptionConfiguration")
        names = {str(resource.props.get("bucket")), str(resource.props.get("id"))}
        if not inline and not names & encrypted:
            report_violation(
                f"S3 bucket {resource.name!r} has no server-side encryption configuration. Risk: model weights "
                "(licensed or fine-tuned, often proprietary) sit unencrypted and rely on account defaults.",
                resource.urn,
            )


def volumes_encrypted_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    props = args.props
    if args.resource_type == LAUNCH_TEMPLATE:
        for mapping_ in sequence(props.get("blockDeviceMappings")):
            ebs = mapping(mapping(mapping_).get("ebs"))
            if ebs and not _true(ebs.get("encrypted")):
                report_violation(
                    f"launch template volume {mapping(mapping_).get('deviceName')!r} is not encrypted. Risk: "
                    "cached model weights, logs and container layers on node disks are readable from snapshots.",
                    None,
                )
    elif args.resource_type == "aws:ebs/volume:Volume" and not _true(props.get("encrypted")):
        report_violation(
            "EBS volume is not encrypted. Risk: its data is readable from snapshots and detached copies.", None
        )
    elif args.resource_type == NODE_GROUP and not props.get("launchTemplate"):
        report_violation(
            "node group has no launch template, so its root volume's encryption is left to account defaults. "
            "Risk: node disks holding model weights may be unencrypted.",
            None,
        )


def cluster_secrets_encrypted_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != "aws:eks/cluster:Cluster":
        return
    config = mapping(args.props.get("encryptionConfig"))
    resources = {str(r) for r in sequence(config.get("resources"))}
    if "secrets" not in resources or not get_path(config, "provider", "keyArn"):
        report_violation(
            "EKS cluster does not envelope-encrypt Kubernetes secrets with a KMS key. Risk: tenant key hashes "
            "and service credentials are readable from etcd backups.",
            None,
        )


buckets_encrypted = StackValidationPolicy(
    name="buckets-encrypted",
    description="Every S3 bucket has server-side encryption.",
    validate=buckets_encrypted_validator,
)

volumes_encrypted = ResourceValidationPolicy(
    name="volumes-encrypted",
    description="Node and EBS volumes are encrypted.",
    validate=volumes_encrypted_validator,
)

cluster_secrets_encrypted = ResourceValidationPolicy(
    name="cluster-secrets-encrypted",
    description="EKS encrypts Kubernetes secrets with a KMS key.",
    validate=cluster_secrets_encrypted_validator,
)
