"""Images: the stack's container repositories and the digest-pinned image every workload runs.

On aws the stack owns one ECR repository per image (`fleet.protocol.contract.IMAGES`, named ``llmfleet-<env>/<image>``):
tags are immutable, so a pushed tag always names the same bits; every push is scanned; images are encrypted
with KMS; and a lifecycle rule expires untagged images beyond the newest few. On kubernetes the images live
under the stack's ``images.registry``. Either way a workload runs ``<repository>@sha256:<digest>``, with the
digest from the stack (``images.runtimeDigest``, ``images.engineDigest``), never a tag: a node runs exactly the
image that was built and reviewed, and `images/push.sh` copies an image without changing its digest. The
repositories are ``protect``ed (``pulumi destroy`` would otherwise fail on them half-way, RepositoryNotEmpty).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from fleet.protocol import contract
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["KEEP_UNTAGGED", "ImageRefs", "ImageRepositories", "ImageRepositoriesArgs", "image_refs", "lifecycle_policy"]

KEEP_UNTAGGED = 10  # untagged images each repository keeps; older ones expire


@dataclass(frozen=True)
class ImageRefs:
    """The image of each kind of workload, as ``<repository>@sha256:<digest>``."""

    runtime: pulumi.Input[str]
    engine: pulumi.Input[str] | None  # None when the stack pins no engine image (no pool runs vLLM)
    device_plugin: pulumi.Input[str]

    def for_pool(self, pool: PoolSpec) -> pulumi.Input[str]:
        """The engine image for a pool that runs vLLM on a node group, else the runtime image."""
        if not pool.runs_engine_image:
            return self.runtime
        if self.engine is None:
            raise ValueError(f"pool {pool.name!r} runs vLLM but the stack pins no llmfleet:images.engineDigest")
        return self.engine


def _pinned(repository: pulumi.Input[str], digest: str) -> pulumi.Output[str]:
    return pulumi.Output.concat(repository, "@", digest)


def image_refs(spec: FleetSpec, repositories: Mapping[str, pulumi.Input[str]] | None = None) -> ImageRefs:
    """The pinned images of ``spec``: in ``repositories`` (image -> repository URL, the aws target's ECR), or
    else under ``images.registry``. ValueError names the stack key that is missing."""
    images = spec.images
    if repositories is None:
        if images.registry is None:
            raise ValueError("llmfleet:images.registry is required: where the images are pushed")
        repositories = {image: f"{images.registry}/{image}" for image in contract.IMAGES}
    if images.runtime_digest is None:
        raise ValueError("llmfleet:images.runtimeDigest is required: the runtime image's digest (`make images`)")
    engine = images.engine_digest
    return ImageRefs(
        runtime=_pinned(repositories[contract.IMAGE_RUNTIME], images.runtime_digest),
        engine=None if engine is None else _pinned(repositories[contract.IMAGE_ENGINE], engine),
        device_plugin=_pinned(
            repositories[contract.IMAGE_DEVICE_PLUGIN], contract.DEVICE_PLUGIN_SOURCE.partition("@")[2]
        ),
    )


def lifecycle_policy(keep_untagged: int = KEEP_UNTAGGED) -> str:
    """An ECR lifecycle policy: expire untagged images beyond the newest ``keep_untagged``."""
    rule = {
        "rulePriority": 1,
        "description": f"keep the newest {keep_untagged} untagged images",
        "selection": {"tagStatus": "untagged", "countType": "imageCountMoreThan", "countNumber": keep_untagged},
        "action": {"type": "expire"},
    }
    return json.dumps({"rules": [rule]})


@dataclass(frozen=True)
class ImageRepositoriesArgs:
    environment: str
    tags: dict[str, str] = field(default_factory=dict)
    keep_untagged: int = KEEP_UNTAGGED


class ImageRepositories(pulumi.ComponentResource):
    """One ECR repository per image. ``urls``: image -> repository URL; ``registry``: the URLs' common prefix,
    where `images/push.sh` pushes (``<account>.dkr.ecr.<region>.amazonaws.com/llmfleet-<env>``)."""

    urls: dict[str, pulumi.Output[str]]
    registry: pulumi.Output[str]

    def __init__(self, name: str, args: ImageRepositoriesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:ImageRepositories", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.urls = {}
        for image in contract.IMAGES:
            repository = aws.ecr.Repository(
                f"{name}-{image}",
                name=contract.image_repository_name(args.environment, image),
                image_tag_mutability="IMMUTABLE",
                image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
                encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="KMS")],
                tags=dict(args.tags),
                opts=pulumi.ResourceOptions(parent=self, protect=True),
            )
            aws.ecr.LifecyclePolicy(
                f"{name}-{image}",
                repository=repository.name,
                policy=lifecycle_policy(args.keep_untagged),
                opts=child,
            )
            self.urls[image] = repository.repository_url
        self.registry = self.urls[contract.IMAGE_RUNTIME].apply(lambda url: url.rsplit("/", 1)[0])
        self.register_outputs({"registry": self.registry})
