"""Preflight checks: read-only questions to an AWS account that a first ``pulumi up`` would otherwise ask too late.

Each check is a function ``check(ctx) -> Iterator[Finding]`` registered by name in `CHECKS`; it only describes
and reads (``Describe*``, ``Get*``, ``HeadObject``), never changes the account. A finding is one line: the check's
name, what is wrong, and what to do. The checks and the calls they make:

* ``zones``: each node group's instance type is offered in each of its zones, compared by zone ID (zone names are
  shuffled per account): ``ec2:DescribeAvailabilityZones``, ``ec2:DescribeInstanceTypeOfferings`` with
  ``LocationType=availability-zone-id``. A managed node group in a zone without the type fails ``CREATE_FAILED``.
* ``quotas``: the vCPU service quota of each instance family and purchase option against the node groups at their
  maximum size (nodes x ``ec2:DescribeInstanceTypes`` vCPUs): ``service-quotas:GetServiceQuota``.
* ``kubernetes-version``: ``cluster.kubernetesVersion`` is in EKS standard support (``eks:DescribeClusterVersions``);
  extended support costs $0.60 instead of $0.10 per cluster-hour.
* ``access``: the calling identity (``sts:GetCallerIdentity``) is one of the roles given access entries: the
  cluster grants its creator nothing (``bootstrapClusterCreatorAdminPermissions: false``), and each role in the
  caller's account exists (``iam:GetRole``), or ``CreateAccessEntry`` fails.
* ``images``: each pinned digest is in the stack's ECR repository (``ecr:DescribeImages``).
* ``certificate``: the gateway's ACM certificate is ``ISSUED``, in the stack's region, and names the gateway's
  host name (``acm:DescribeCertificate``).
* ``model-manifest``: each vLLM pool's model has its manifest in the bucket (``s3:HeadObject``).
* ``placeholders``: no placeholder of the shipped stacks is left (`fleet.spec.placeholders`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.protocol import contract
from fleet.protocol.model_manifest import ModelKeys
from fleet.spec.placeholders import PLACEHOLDER_ACCOUNT, PLACEHOLDER_DIGEST, ROLE_ARN, placeholder_problems
from fleet.spec.stack import FleetSpec

__all__ = ["CHECKS", "QUOTA_CODES", "ClientFactory", "Finding", "PreflightContext", "matches_host", "run_checks"]

ClientFactory = Callable[[str], Any]  # service name -> a boto3 client of the stack's region


@dataclass(frozen=True)
class PreflightContext:
    """What every check reads: the stack, clients of its region, and what only the operator knows."""

    stack: str
    spec: FleetSpec
    clients: ClientFactory
    bucket: str | None = None  # the model bucket (stack output modelBucket); None: not known
    hostname: str | None = None  # the gateway's host name, which the certificate must name


@dataclass(frozen=True)
class Finding:
    """One problem, as one line: ``<check>: <message>``."""

    check: str
    message: str

    def render(self) -> str:
        return f"{self.check}: {self.message}"


Check = Callable[[PreflightContext], Iterator[Finding]]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


def _code(error: Exception) -> str:
    """A botocore ClientError's error code ("" for anything else)."""
    response = getattr(error, "response", None)
    return str((response or {}).get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def run_checks(ctx: PreflightContext, names: Sequence[str] | None = None) -> list[Finding]:
    """Every finding of the checks ``names`` (default: all, in `CHECKS` order). A check the account refuses to
    answer (no permission, no endpoint) is itself a finding, and the other checks still run."""
    from botocore.exceptions import BotoCoreError, ClientError

    found: list[Finding] = []
    for name in names or list(CHECKS):
        try:
            found += CHECKS[name](ctx)
        except (BotoCoreError, ClientError) as exc:
            found.append(Finding(name, f"could not check: {exc}"))
    return found


@dataclass(frozen=True)
class _Group:
    name: str
    instance_type: str
    zones: list[str]
    max_nodes: int  # over all its zones
    capacity_type: str


def _groups(spec: FleetSpec) -> list[_Group]:
    """Every node group of the stack, the CPU group first."""
    cpu = spec.cpu_node_group
    # The CPU group is one group over every zone: maxNodes is its total, not a per-zone figure.
    rows = [_Group("cpu", cpu.instance_type, list(spec.availability_zones), cpu.max_nodes, "on-demand")]
    for g in spec.gpu_node_groups:
        zones = spec.zones_of(g)
        rows.append(_Group(g.name, g.instance_type, zones, g.max_nodes_per_az * len(zones), g.capacity_type))
    return rows


def _zone_ids(ctx: PreflightContext) -> dict[str, str]:
    zones = ctx.clients("ec2").describe_availability_zones(AllAvailabilityZones=True)["AvailabilityZones"]
    return {z["ZoneName"]: z["ZoneId"] for z in zones}


@check("zones")
def check_zones(ctx: PreflightContext) -> Iterator[Finding]:
    ids = _zone_ids(ctx)
    names = {zone_id: name for name, zone_id in ids.items()}
    ec2 = ctx.clients("ec2")
    for group in _groups(ctx.spec):
        offered: set[str] = set()
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": [group.instance_type]}]
        )
        for page in pages:
            offered |= {o["Location"] for o in page["InstanceTypeOfferings"]}
        where = ", ".join(f"{names.get(z, '?')} ({z})" for z in sorted(offered)) or "no zone"
        for zone in group.zones:
            if zone not in ids:
                yield Finding("zones", f"{zone} is not a zone of {ctx.spec.region} in this account")
            elif ids[zone] not in offered:
                yield Finding(
                    "zones",
                    f"node group {group.name}: {group.instance_type} is not offered in {zone} ({ids[zone]}), so "
                    f"the node group there fails to create; {ctx.spec.region} offers it in {where}",
                )


# (instance family class, purchase option) -> Service Quotas code of its vCPU quota (service code ec2).
QUOTA_CODES: dict[tuple[str, str], tuple[str, str]] = {
    ("P", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("G", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("G", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("Standard", "on-demand"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
}


def _family_class(instance_type: str) -> str | None:
    letter = instance_type[:1].lower()
    if letter == "p":
        return "P"
    if letter in ("g", "v"):
        return "G"
    return "Standard" if letter in "acdhimrtz" else None


@check("quotas")
def check_quotas(ctx: PreflightContext) -> Iterator[Finding]:
    groups = [g for g in _groups(ctx.spec) if g.capacity_type != "capacity-block"]  # reserved and paid up front
    types = sorted({g.instance_type for g in groups})
    described = ctx.clients("ec2").describe_instance_types(InstanceTypes=types)["InstanceTypes"]
    vcpus = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in described}
    needed: dict[tuple[str, str], int] = defaultdict(int)
    who: dict[tuple[str, str], list[str]] = defaultdict(list)
    for group in groups:
        key = (_family_class(group.instance_type) or "", group.capacity_type)
        if key not in QUOTA_CODES:
            continue
        needed[key] += group.max_nodes * vcpus[group.instance_type]
        who[key].append(f"{group.name}: {group.max_nodes} x {group.instance_type}")
    quotas = ctx.clients("service-quotas")
    for key, want in needed.items():
        code, title = QUOTA_CODES[key]
        value = float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        if value < want:
            yield Finding(
                "quotas",
                f"{title} ({code}) is {value:g} vCPUs; the node groups at their maximum ({'; '.join(who[key])}) need "
                f"{want}: request an increase (aws service-quotas request-service-quota-increase --service-code ec2 "
                f"--quota-code {code} --desired-value {want}). Instances running elsewhere in the account count too",
            )


@check("kubernetes-version")
def check_kubernetes_version(ctx: PreflightContext) -> Iterator[Finding]:
    version = ctx.spec.cluster.kubernetes_version
    answer = ctx.clients("eks").describe_cluster_versions(clusterVersions=[version], includeAll=True)
    info = next((v for v in answer.get("clusterVersions", []) if v.get("clusterVersion") == version), None)
    if info is None:
        yield Finding("kubernetes-version", f"EKS does not offer Kubernetes {version} (cluster.kubernetesVersion)")
        return
    status = info.get("versionStatus")
    if status != "STANDARD_SUPPORT":
        ended = info.get("endOfStandardSupportDate")
        when = f" since {ended:%Y-%m-%d}" if ended is not None else ""
        yield Finding(
            "kubernetes-version",
            f"Kubernetes {version} is {str(status).lower().replace('_', ' ')}{when}: the control plane costs $0.60 "
            "instead of $0.10 an hour; set cluster.kubernetesVersion to a version in standard support",
        )


_ASSUMED_ROLE = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/")


def _caller_role(arn: str) -> tuple[str, str] | None:
    """(account, role name) of an assumed-role or role ARN; None for a user or root."""
    if found := _ASSUMED_ROLE.match(arn):
        return found.group(2), found.group(3)
    if ROLE_ARN.match(arn):
        return arn.split(":")[4], arn.rsplit("/", 1)[1]
    return None


@check("access")
def check_access(ctx: PreflightContext) -> Iterator[Finding]:
    cluster = ctx.spec.cluster
    listed = [*cluster.admin_role_arns, *cluster.ci_role_arns]
    caller = str(ctx.clients("sts").get_caller_identity()["Arn"])
    mine = _caller_role(caller)
    roles = {_caller_role(arn) for arn in listed}
    if mine is None or mine not in roles:
        yield Finding(
            "access",
            f"the calling identity {caller} is not one of cluster.adminRoleArns or cluster.ciRoleArns: the cluster "
            "gives its creator no access of its own, so the first `pulumi up` as this identity is refused by the "
            "Kubernetes API as Unauthorized; run it as a listed role, or list this one",
        )
    account = mine[0] if mine is not None else str(ctx.clients("sts").get_caller_identity()["Account"])
    iam = ctx.clients("iam")
    for arn in dict.fromkeys(listed):
        role = _caller_role(arn)
        if role is None or role[0] != account or role[0] == PLACEHOLDER_ACCOUNT:
            continue  # another account's role cannot be looked up from here; a placeholder is reported apart
        try:
            iam.get_role(RoleName=role[1])
        except Exception as exc:
            if _code(exc) != "NoSuchEntity":
                raise
            yield Finding("access", f"role {arn} does not exist, so its access entry cannot be created")


def _pinned_images(spec: FleetSpec) -> list[tuple[str, str]]:
    """(image, digest) of every image the stack pulls from its ECR repositories."""
    pinned = [(contract.IMAGE_RUNTIME, spec.images.runtime_digest)]
    if any(p.runs_engine_image for p in spec.pools):
        pinned.append((contract.IMAGE_ENGINE, spec.images.engine_digest))
    pinned.append((contract.IMAGE_DEVICE_PLUGIN, contract.DEVICE_PLUGIN_SOURCE.partition("@")[2]))
    return [(image, digest) for image, digest in pinned if digest and digest != PLACEHOLDER_DIGEST]


@check("images")
def check_images(ctx: PreflightContext) -> Iterator[Finding]:
    ecr = ctx.clients("ecr")
    for image, digest in _pinned_images(ctx.spec):
        repository = contract.image_repository_name(ctx.spec.environment, image)
        try:
            ecr.describe_images(repositoryName=repository, imageIds=[{"imageDigest": digest}])
        except Exception as exc:
            code = _code(exc)
            if code == "RepositoryNotFoundException":
                yield Finding("images", f"repository {repository} does not exist: create it first (docs/cloud.md, 4)")
            elif code == "ImageNotFoundException":
                yield Finding("images", f"{repository}@{digest} is not in the repository: push it with images/push.sh")
            else:
                raise


def matches_host(pattern: str, host: str) -> bool:
    """Whether a certificate name covers ``host``: equal, or a ``*.`` wildcard standing for exactly one label."""
    pattern, host = pattern.lower().rstrip("."), host.lower().rstrip(".")
    if pattern.startswith("*."):
        first, _, rest = host.partition(".")
        return bool(first) and rest == pattern[2:]
    return pattern == host


@check("certificate")
def check_certificate(ctx: PreflightContext) -> Iterator[Finding]:
    spec = ctx.spec
    arn = spec.gateway.tls.certificate_arn
    if not spec.gateway.public or arn is None or f":{PLACEHOLDER_ACCOUNT}:" in arn:
        return
    if arn.split(":")[3:4] != [spec.region]:
        yield Finding("certificate", f"{arn} is not in {spec.region}: the load balancer's listener needs one there")
        return
    try:
        cert = ctx.clients("acm").describe_certificate(CertificateArn=arn)["Certificate"]
    except Exception as exc:
        if _code(exc) != "ResourceNotFoundException":
            raise
        yield Finding("certificate", f"{arn} does not exist in this account")
        return
    if cert.get("Status") != "ISSUED":
        yield Finding("certificate", f"{arn} is {cert.get('Status')}, not ISSUED: the TLS listener cannot use it")
    names = [cert.get("DomainName", ""), *cert.get("SubjectAlternativeNames", [])]
    if ctx.hostname is None:
        return
    if not any(matches_host(name, ctx.hostname) for name in names if name):
        yield Finding(
            "certificate",
            f"{arn} names {', '.join(sorted(set(n for n in names if n)))}, not {ctx.hostname}: clients fail TLS "
            "verification",
        )


@check("model-manifest")
def check_model_manifest(ctx: PreflightContext) -> Iterator[Finding]:
    spec = ctx.spec
    models = sorted({(p.model, p.model_revision) for p in spec.pools if p.runs_engine_image})
    if not models:
        return
    if ctx.bucket is None:
        yield Finding(
            "model-manifest", "the model bucket is unknown: pass --bucket, or create it first (docs/cloud.md, 4)"
        )
        return
    s3 = ctx.clients("s3")
    for model, revision in models:
        keys = ModelKeys(spec.model_store.prefix, model, revision)
        try:
            s3.head_object(Bucket=ctx.bucket, Key=keys.manifest)
        except Exception as exc:
            if _code(exc) not in ("404", "403"):
                raise
            # HEAD answers without a body: a missing key and a missing bucket are both a bare 404.
            missing = "not found (no manifest, or no bucket)" if _code(exc) == "404" else "access denied"
            fallback = " (engines fall back to the Hugging Face Hub)" if spec.model_store.hub_fallback else ""
            yield Finding(
                "model-manifest",
                f"s3://{ctx.bucket}/{keys.manifest}: {missing}{fallback}; push the model with "
                f"`llmfleet model push --stack {ctx.stack} DIR --model {model} --revision {revision}`",
            )


@check("placeholders")
def check_placeholders(ctx: PreflightContext) -> Iterator[Finding]:
    for problem in placeholder_problems(ctx.spec):
        yield Finding("placeholders", f"{problem.path}: {problem.message}")
