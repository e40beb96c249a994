"""Image rules: every workload runs an image pinned by digest and, on aws, pulled from the stack's own ECR."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pulumi_policy import (
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from policies.common import DEPLOYMENT, get_path, mapping, sequence

__all__ = ["images_from_stack_registries", "images_pinned_by_digest", "repository_of", "workload_images"]

EKS_CLUSTER = "aws:eks/cluster:Cluster"
ECR_REPOSITORY = "aws:ecr/repository:Repository"
# Workload type -> where its pod spec sits.
_POD_SPEC: dict[str, tuple[str, ...]] = {
    DEPLOYMENT: ("spec", "template", "spec"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template", "spec"),
    "kubernetes:batch/v1:Job": ("spec", "template", "spec"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
_PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def workload_images(resource_type: str, props: Any) -> Iterator[str]:
    """The image of every container and init container of a workload (nothing for other resources)."""
    path = _POD_SPEC.get(resource_type)
    if path is None:
        return
    pod = mapping(get_path(props, *path))
    for key in ("initContainers", "containers"):
        for container in sequence(pod.get(key)):
            yield str(mapping(container).get("image") or "")


def repository_of(image: str) -> str:
    """``registry/path/name`` of an image reference, without its tag or digest."""
    name = image.partition("@")[0]
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.partition(':')[0]}"


def images_pinned_by_digest_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for image in workload_images(args.resource_type, args.props):
        if not _PINNED.match(image):
            report_violation(
                f"container image {image!r} is not pinned by digest (<repository>@sha256:<64 hex digits>). Risk: "
                "a tag can be moved or overwritten, so nodes may run code nobody reviewed, replicas of one workload "
                "may run different builds, and a rollback may not bring back the same image.",
                None,
            )


def images_from_stack_registries_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    if not any(r.resource_type == EKS_CLUSTER for r in args.resources):
        return  # not an aws stack: it owns no registry
    owned = {str(r.props.get("repositoryUrl")) for r in args.resources if r.resource_type == ECR_REPOSITORY}
    for resource in args.resources:
        for image in workload_images(resource.resource_type, resource.props):
            if repository_of(image) in owned:
                continue
            report_violation(
                f"{resource.name}: container image {image!r} does not come from one of the stack's ECR repositories "
                f"({', '.join(sorted(owned)) or 'none'}). Risk: its pods depend on a registry outside the stack's "
                "account to start (outages, rate limits, deleted images), and the image skips the repositories' "
                "immutable tags and scan on push.",
                resource.urn,
            )


images_pinned_by_digest = ResourceValidationPolicy(
    name="images-pinned-by-digest",
    description="Every container image of a Deployment, DaemonSet, StatefulSet, Job or CronJob is pinned by digest.",
    validate=images_pinned_by_digest_validator,
)

images_from_stack_registries = StackValidationPolicy(
    name="images-from-stack-registries",
    description="On aws, every container image comes from an ECR repository the stack owns.",
    validate=images_from_stack_registries_validator,
)
