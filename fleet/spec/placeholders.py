"""Placeholders: the stand-ins a shipped stack file carries until an operator fills in their own account.

The shipped cloud stacks name account 000000000000 (access-entry roles, the ACM certificate), an all-zero image
digest and the documentation range 203.0.113.0/24 so that they validate and run under mocks. Each names
nothing real: AWS refuses them only once the program reaches the resource (an access entry, the TLS listener, the
first engine pull), about 20 minutes into a first ``pulumi up``, after the cluster exists.

`placeholder_problems` finds them. ``llmfleet validate`` reports them as warnings (a stack file in the repository
keeps them); the Pulumi program raises them as errors on ``pulumi up`` for target aws (`infra.config`), and
``llmfleet preflight`` reports them before either.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Literal

from fleet.spec.errors import Problem
from fleet.spec.stack import FleetSpec

__all__ = ["DOCUMENTATION_NETS", "PLACEHOLDER_ACCOUNT", "PLACEHOLDER_DIGEST", "ROLE_ARN", "placeholder_problems"]

# A digest that is well-formed but names no image: a stack file's stand-in until a release's digest is pinned.
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
PLACEHOLDER_ACCOUNT = "000000000000"
# RFC 5737 documentation ranges: no client's address is in them.
DOCUMENTATION_NETS = tuple(ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[A-Za-z0-9+=,.@_/-]+$")


def _in_account(arn: str) -> bool:
    return f":{PLACEHOLDER_ACCOUNT}:" in arn


def _documentation_range(cidr: str) -> bool:
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        return False  # not a CIDR at all: `fleet.spec.validate` reports that as an error of its own
    return any(network.subnet_of(doc) for doc in DOCUMENTATION_NETS if doc.version == network.version)  # type: ignore[arg-type]


def _found(spec: FleetSpec) -> Iterator[tuple[str, str]]:
    """(key path, message) of every placeholder in ``spec`` (order follows the file)."""
    if spec.target == "local":
        return
    cluster = spec.cluster
    for i, cidr in enumerate(cluster.public_endpoint_cidrs):
        if _documentation_range(cidr):
            yield (
                f"cluster.publicEndpointCidrs[{i}]",
                f"{cidr} is a documentation range (RFC 5737) that no client uses: a placeholder to replace",
            )
    for key, arns in (("adminRoleArns", cluster.admin_role_arns), ("ciRoleArns", cluster.ci_role_arns)):
        for i, arn in enumerate(arns):
            if ROLE_ARN.match(arn) and _in_account(arn):
                yield f"cluster.{key}[{i}]", "a placeholder account: set your role's ARN before `pulumi up`"
    certificate = spec.gateway.tls.certificate_arn
    if spec.target == "aws" and spec.gateway.public and certificate is not None and _in_account(certificate):
        yield "gateway.tls.certificateArn", "a placeholder: set your ACM certificate's ARN before `pulumi up`"
    images = spec.images
    pinned = [("runtimeDigest", images.runtime_digest, "runtime")]
    if any(p.runs_engine_image for p in spec.pools):
        pinned.append(("engineDigest", images.engine_digest, "engine"))
    for key, digest, image in pinned:
        if digest == PLACEHOLDER_DIGEST:
            yield (
                f"images.{key}",
                f"a placeholder that names no image: pin the release's {image} digest "
                f"(`images/build.sh {image}` prints it) before `pulumi up`",
            )


def placeholder_problems(spec: FleetSpec, level: Literal["error", "warning"] = "warning") -> list[Problem]:
    """Every placeholder left in ``spec``, at ``level``; none on target local (nothing there reaches AWS)."""
    return [Problem(f"llmfleet:{path}", message, level=level) for path, message in _found(spec)]
