"""``llmfleet preflight`` against moto's server: an account that passes, and one account per problem.

moto serves EC2 (zones, offerings, instance types), STS, IAM, ECR, ACM and S3. It has no EC2 service quotas (its
Service Quotas backend knows only ``vpc``) and no ``eks:DescribeClusterVersions`` (it answers "Not yet
implemented"), so those two clients are botocore's own `Stubber`, answering with responses shaped as botocore's
service model records them (Stubber validates each one against the operation's output shape), and checking that
the calls ask for the right quota codes and version.

moto's us-east-1 offers p4de.24xlarge in use1-az4 and use1-az6 only, which its zone names map to us-east-1d and
us-east-1a, so the passing stack runs there.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.stub import Stubber
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet.protocol import contract
from llmfleet.commands import preflight
from llmfleet.commands.preflight_checks import CHECKS, matches_host
from tests.support.stacks import write_stack

ACCOUNT = "123456789012"  # moto's
REGION = "us-east-1"
ZONES = ["us-east-1a", "us-east-1d"]
BUCKET = "llmfleet-prod-models"
HOST = "api.example.com"
RUNTIME = "sha256:" + hashlib.sha256(b"runtime").hexdigest()
ENGINE = "sha256:" + hashlib.sha256(b"engine").hexdigest()
DEVICE_PLUGIN = contract.DEVICE_PLUGIN_SOURCE.partition("@")[2]
MANIFEST_KEY = "models/Qwen/Qwen2.5-7B-Instruct/main/manifest.json"
QUOTA_CODES = {"Standard": "L-1216C47A", "P": "L-417A185B"}


def _self_signed(*names: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=90))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


@dataclass
class Account:
    """What one test account holds; `build` makes it in moto. Defaults: an account that passes."""

    url: str
    roles: tuple[str, ...] = ("llmfleet-admin", "llmfleet-ci")
    run_as: str | None = "llmfleet-ci"  # the role the preflight's credentials belong to; None: moto's user
    images: dict[str, str] = field(
        default_factory=lambda: {
            contract.IMAGE_RUNTIME: RUNTIME,
            contract.IMAGE_ENGINE: ENGINE,
            contract.IMAGE_DEVICE_PLUGIN: DEVICE_PLUGIN,
        }
    )
    certificate: str = "issued"  # issued | pending
    certificate_names: tuple[str, ...] = (HOST,)
    manifest: bool = True
    p_quota_vcpus: float = 768.0  # 2 zones x 2 nodes x 96 vCPUs = 384 needed
    version_status: str = "STANDARD_SUPPORT"
    credentials: dict[str, str] = field(default_factory=dict)
    certificate_arn: str = ""

    def client(self, service: str) -> Any:
        return boto3.client(service, region_name=REGION, endpoint_url=self.url, **self.credentials)

    def build(self) -> Account:
        httpx.post(f"{self.url}/moto-api/reset").raise_for_status()
        self.credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        iam = self.client("iam")
        for role in self.roles:
            iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17"}))
        ecr = self.client("ecr")
        for image in contract.IMAGES:
            ecr.create_repository(repositoryName=contract.image_repository_name("prod", image))
        for image, digest in self.images.items():
            manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"})
            ecr.put_image(
                repositoryName=contract.image_repository_name("prod", image),
                imageManifest=manifest,
                imageTag=f"v1-{digest[7:19]}",
                imageDigest=digest,
            )
        acm = self.client("acm")
        if self.certificate == "issued":
            cert, key = _self_signed(*self.certificate_names)
            self.certificate_arn = acm.import_certificate(Certificate=cert, PrivateKey=key)["CertificateArn"]
        else:
            self.certificate_arn = acm.request_certificate(DomainName=self.certificate_names[0])["CertificateArn"]
        s3 = self.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        if self.manifest:
            s3.put_object(Bucket=BUCKET, Key=MANIFEST_KEY, Body=b'{"format": 1}')
        if self.run_as is not None:
            assumed = self.client("sts").assume_role(
                RoleArn=f"arn:aws:iam::{ACCOUNT}:role/{self.run_as}", RoleSessionName="preflight"
            )["Credentials"]
            self.credentials = {
                "aws_access_key_id": assumed["AccessKeyId"],
                "aws_secret_access_key": assumed["SecretAccessKey"],
                "aws_session_token": assumed["SessionToken"],
            }
        return self

    def stubbed(self, service: str) -> tuple[Any, Stubber]:
        """A client of ``service`` whose answers are queued on its Stubber (nothing reaches moto)."""
        client = self.client(service)
        stubber = Stubber(client)
        if service == "eks":
            info: dict[str, Any] = {
                "clusterVersion": "1.35",
                "clusterType": "eks",
                "status": self.version_status.lower().replace("_", "-"),
                "versionStatus": self.version_status,
            }
            if self.version_status != "STANDARD_SUPPORT":
                info["endOfStandardSupportDate"] = datetime.datetime(2026, 7, 29, tzinfo=datetime.UTC)
            stubber.add_response(
                "describe_cluster_versions",
                {"clusterVersions": [info]},
                {"clusterVersions": ["1.35"], "includeAll": True},
            )
        else:  # service-quotas: the CPU group's Standard quota, then the GPU group's P quota (the order asked)
            for family, value in (("Standard", 640.0), ("P", self.p_quota_vcpus)):
                code = QUOTA_CODES[family]
                quota = {
                    "ServiceCode": "ec2",
                    "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                    "QuotaArn": f"arn:aws:servicequotas:{REGION}:{ACCOUNT}:ec2/{code}",
                    "QuotaCode": code,
                    "QuotaName": f"Running On-Demand {family} instances",
                    "Value": value,
                    "Unit": "None",
                    "Adjustable": True,
                    "GlobalQuota": False,
                }
                stubber.add_response("get_service_quota", {"Quota": quota}, {"ServiceCode": "ec2", "QuotaCode": code})
        stubber.activate()
        return client, stubber


def _preflight(
    tmp_path: Path,
    account: Account,
    capsys: pytest.CaptureFixture[str],
    hostname: str | None = None,
    shipped: bool = False,
    **overrides: Any,
) -> tuple[int, list[str]]:
    """``llmfleet preflight --stack prod --bucket BUCKET``: the shipped prod stack with this account's roles,
    digests and certificate instead of its placeholders, in the zones where moto offers p4de (``shipped``: as
    shipped, placeholders and all)."""
    stack = write_stack(
        tmp_path / "Pulumi.prod.yaml",
        "prod",
        **{}
        if shipped
        else {
            "availabilityZones": ZONES,
            "cluster.publicEndpointCidrs": ["198.18.0.0/15"],
            "cluster.adminRoleArns": [f"arn:aws:iam::{ACCOUNT}:role/llmfleet-admin"],
            "cluster.ciRoleArns": [f"arn:aws:iam::{ACCOUNT}:role/llmfleet-ci"],
            "cluster.kubernetesVersion": "1.35",
            "images": {"runtimeDigest": RUNTIME, "engineDigest": ENGINE},
            "gateway.hostname": HOST,
            "gateway.tls.certificateArn": account.certificate_arn,
            **overrides,
        },
    )
    stubbed = {name: account.stubbed(name) for name in ("eks", "service-quotas")}
    clients: dict[str, Any] = {name: client for name, (client, _) in stubbed.items()}

    def factory(service: str) -> Any:
        if service not in clients:
            clients[service] = account.client(service)
        return clients[service]

    parser = argparse.ArgumentParser()
    preflight.add_arguments(parser)
    flags = ["--stack", str(stack), "--bucket", BUCKET, *(["--hostname", hostname] if hostname else [])]
    code = preflight.run(parser.parse_args(flags), clients=factory)
    for _, stubber in stubbed.values():
        stubber.assert_no_pending_responses()  # every stubbed call was made, with the expected parameters
    return code, capsys.readouterr().out.splitlines()


def _problems(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("preflight ")]


def test_the_shipped_prod_stack_names_its_placeholders_and_zones(
    tmp_path: Path, moto_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = _preflight(tmp_path, Account(moto_url).build(), capsys, shipped=True)
    checks = [line.split(":", 1)[0] for line in _problems(lines)]
    # us-east-1b and us-east-1c lack p4de here; the listed roles are account 000000000000's, not the caller's.
    assert checks == ["zones", "zones", "access", *["placeholders"] * 6]
    assert code == 1


def test_an_account_that_passes(tmp_path: Path, moto_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _preflight(tmp_path, Account(moto_url).build(), capsys)
    assert lines == [f"preflight prod: no problems ({len(CHECKS)} checks: {', '.join(CHECKS)})"]
    assert code == 0


# name, the account (Account fields), the stack (overrides), the one line expected
PROBLEMS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "a zone without the instance type",
        {},
        {"availabilityZones": ["us-east-1a", "us-east-1b"]},
        "zones: node group a100: p4de.24xlarge is not offered in us-east-1b (use1-az1)",
    ),
    (
        "a P-instance quota under the groups' maximum",
        {"p_quota_vcpus": 96.0},
        {},
        "quotas: Running On-Demand P instances (L-417A185B) is 96 vCPUs; the node groups at their maximum "
        "(a100: 4 x p4de.24xlarge) need 384",
    ),
    (
        "a version in extended support",
        {"version_status": "EXTENDED_SUPPORT"},
        {},
        "kubernetes-version: Kubernetes 1.35 is extended support since 2026-07-29",
    ),
    (
        "a caller that is no listed role",
        {"run_as": None},
        {},
        f"access: the calling identity arn:aws:sts::{ACCOUNT}:user/moto is not one of cluster.adminRoleArns",
    ),
    (
        "a listed role that does not exist",
        {"roles": ("llmfleet-ci",)},
        {},
        f"access: role arn:aws:iam::{ACCOUNT}:role/llmfleet-admin does not exist",
    ),
    (
        "an engine digest never pushed",
        {"images": {contract.IMAGE_RUNTIME: RUNTIME, contract.IMAGE_DEVICE_PLUGIN: DEVICE_PLUGIN}},
        {},
        f"images: llmfleet-prod/engine@{ENGINE} is not in the repository",
    ),
    (
        "a certificate still pending validation",
        {"certificate": "pending"},
        {},
        "is PENDING_VALIDATION, not ISSUED",
    ),
    (
        "a certificate for another host name",
        {"certificate_names": ("www.example.com", "*.example.org")},
        {},
        "names *.example.org, www.example.com, not api.example.com",
    ),
    (
        "a model never pushed",
        {"manifest": False},
        {},
        f"model-manifest: s3://{BUCKET}/{MANIFEST_KEY}: not found",
    ),
    (
        "a placeholder digest",
        {},
        {"images.runtimeDigest": "sha256:" + "0" * 64},
        "placeholders: llmfleet:images.runtimeDigest: a placeholder that names no image",
    ),
]


@pytest.mark.parametrize(("account", "overrides", "problem"), [pytest.param(a, o, p, id=n) for n, a, o, p in PROBLEMS])
def test_each_problem_is_one_line(
    tmp_path: Path,
    moto_url: str,
    capsys: pytest.CaptureFixture[str],
    account: dict[str, Any],
    overrides: dict[str, Any],
    problem: str,
) -> None:
    code, lines = _preflight(tmp_path, Account(moto_url, **account).build(), capsys, **overrides)
    (found,) = _problems(lines)
    assert problem in found
    assert lines[-1] == f"preflight prod: 1 problem ({len(CHECKS)} checks)"
    assert code == 1


@pytest.mark.parametrize(
    ("pattern", "host", "covered"),
    [
        ("api.example.com", "api.example.com", True),
        ("API.example.com.", "api.example.com", True),
        ("*.example.com", "api.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "a.b.example.com", False),
        ("www.example.com", "api.example.com", False),
    ],
)
def test_certificate_names_cover_a_host(pattern: str, host: str, covered: bool) -> None:
    assert matches_host(pattern, host) is covered


def test_a_stack_not_on_aws_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    preflight.add_arguments(parser)
    assert preflight.run(parser.parse_args(["--stack", "dev"]), clients=lambda service: None) == 2
    assert "target kubernetes" in capsys.readouterr().out
