"""Placeholders in a target-aws stack: errors on a real `pulumi up`, warnings under mocks and in a preview."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from fleet.spec.errors import SpecError
from infra import config as infra_config
from infra.config import spec_from_config, stack_config, under_mocks
from infra.offline import run_offline
from tests.support.stacks import stack_document

# Every placeholder the shipped prod stack carries, by key path.
PROD_PLACEHOLDERS = {
    "llmfleet:cluster.publicEndpointCidrs[0]",
    "llmfleet:cluster.adminRoleArns[0]",
    "llmfleet:cluster.ciRoleArns[0]",
    "llmfleet:gateway.tls.certificateArn",
    "llmfleet:images.runtimeDigest",
    "llmfleet:images.engineDigest",
}


def _load(document: dict[str, Any], stack: str, **kwargs: Any) -> list[Any]:
    """``spec_from_config`` inside a program run under mocks; the spec it returned (one item)."""
    got: list[Any] = []

    def program() -> None:
        got.append(spec_from_config(stack, **kwargs))

    run_offline(program, stack_config(document), stack=stack)
    return got


def test_mocks_are_told_apart_from_a_real_deployment() -> None:
    seen: list[bool] = []
    run_offline(lambda: seen.append(under_mocks()), {}, stack="prod")
    assert seen == [True]


def test_placeholders_stay_warnings_under_mocks() -> None:
    (spec,) = _load(stack_document("prod"), "prod")
    assert spec.target == "aws"


def test_placeholders_are_errors_on_a_real_pulumi_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(infra_config, "under_mocks", lambda: False)  # what a `pulumi up` has: no mock monitor
    with pytest.raises(SpecError) as error:
        _load(stack_document("prod"), "prod")
    assert {p.path for p in error.value.problems} == PROD_PLACEHOLDERS
    assert all(p.level == "error" for p in error.value.problems)


def test_a_real_preview_only_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(infra_config, "under_mocks", lambda: False)
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: True)
    (spec,) = _load(stack_document("prod"), "prod")
    assert spec.environment == "prod"


def test_a_filled_in_aws_stack_passes_a_real_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(infra_config, "under_mocks", lambda: False)
    (spec,) = _load(stack_document("aws"), "prod")
    assert spec.images.runtime_digest == "sha256:" + "1" * 64


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ({"images.runtimeDigest": "sha256:" + "0" * 64}, "llmfleet:images.runtimeDigest"),
        ({"cluster.publicEndpointCidrs": ["203.0.113.0/25"]}, "llmfleet:cluster.publicEndpointCidrs[0]"),
        ({"cluster.ciRoleArns": ["arn:aws:iam::000000000000:role/ci"]}, "llmfleet:cluster.ciRoleArns[0]"),
        (
            {"gateway.tls.certificateArn": "arn:aws:acm:us-east-1:000000000000:certificate/x"},
            "llmfleet:gateway.tls.certificateArn",
        ),
    ],
)
def test_each_placeholder_fails_a_strict_load(override: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as error:
        _load(stack_document("aws", **override), "prod", strict_placeholders=True)
    assert [p.path for p in error.value.problems] == [path]


def test_a_kubernetes_stack_keeps_its_placeholders_as_warnings() -> None:
    (spec,) = _load(stack_document("dev"), "dev", strict_placeholders=True)
    assert spec.target == "kubernetes"
