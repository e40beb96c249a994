"""The documented first, targeted ``up`` (docs/cloud.md, step 4) makes the model bucket with all its settings.

Weights are pushed between that ``up`` and the full one. S3's default encryption and versioning apply only to
objects written after they are set, so every S3 resource of the model store must be in the ``--target`` list,
and the list must be closed under dependencies (a targeted resource that reads an untargeted one that does not
exist yet fails the ``up``). The bucket's policy refuses requests not made over TLS.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from infra.offline import OfflineRun
from infra.storage import tls_only_policy
from tests.infra.conftest import stack_run

CLOUD_MD = Path(__file__).resolve().parents[2] / "docs" / "cloud.md"
STACK_PREFIX = "pulumi:pulumi:Stack$"  # the mocks keep the root stack's type in its children's URNs; the engine not


def documented_targets(text: str) -> set[str]:
    """The URNs of the ``--target`` flags of the shell block that runs the first ``pulumi up -s prod``."""
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "--target" in b and "pulumi up -s prod" in b]
    variables: dict[str, str] = {}
    targets: set[str] = set()
    for line in block.replace("\\\n", " ").splitlines():
        assignment = re.fullmatch(r"([A-Z_]+)=(.*)", line.strip())
        words = shlex.split(line, comments=True)
        if assignment:
            variables[assignment[1]] = _expand(shlex.split(assignment[2])[0], variables)
        elif words[:3] == ["pulumi", "up", "-s"]:
            targets |= {_expand(w, variables) for f, w in zip(words, words[1:], strict=False) if f == "--target"}
    return targets


def _expand(word: str, variables: dict[str, str]) -> str:
    # As the shell does in double quotes: `$NAME` is the variable, `\$` a literal dollar (shlex keeps the backslash).
    return re.sub(r"(?<!\\)\$([A-Z_]+)", lambda m: variables.get(m[1], m[0]), word).replace("\\$", "$")


def _urn(urn: str) -> str:
    return urn.replace(STACK_PREFIX, "")


@pytest.fixture(scope="module")
def run() -> OfflineRun:
    return stack_run("prod")


@pytest.fixture(scope="module")
def targets() -> set[str]:
    return documented_targets(CLOUD_MD.read_text())


def test_every_s3_resource_of_the_model_store_is_targeted(run: OfflineRun, targets: set[str]) -> None:
    s3 = {_urn(r.urn) for r in run.resources if r.type.startswith("aws:s3/") and "ModelStore$" in r.urn}
    assert {t.split("::")[-2].split("$")[-1] for t in s3} >= {
        "aws:s3/bucket:Bucket",
        "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "aws:s3/bucketPolicy:BucketPolicy",
    }
    assert s3 <= targets, sorted(s3 - targets)


def test_the_targets_name_resources_the_program_makes_and_what_they_read(run: OfflineRun, targets: set[str]) -> None:
    by_urn = {_urn(r.urn): r for r in run.resources}
    assert targets <= set(by_urn), sorted(targets - set(by_urn))
    for target in targets:
        missing = {_urn(d) for d in by_urn[target].dependencies} - targets
        assert not missing, f"{target} reads untargeted {sorted(missing)}"


def test_the_bucket_refuses_requests_not_made_over_tls(run: OfflineRun) -> None:
    (bucket,) = run.of_type("aws:s3/bucket:Bucket")
    (policy,) = run.of_type("aws:s3/bucketPolicy:BucketPolicy")
    assert policy.props["bucket"] == bucket.props["bucket"] or policy.props["bucket"].startswith(bucket.name)
    assert json.loads(policy.props["policy"]) == json.loads(tls_only_policy(bucket.props["arn"]))
    (statement,) = json.loads(policy.props["policy"])["Statement"]
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*" and statement["Action"] == "s3:*"
    assert statement["Resource"] == [bucket.props["arn"], f"{bucket.props['arn']}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
