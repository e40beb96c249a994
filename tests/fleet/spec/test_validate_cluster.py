"""`llmfleet validate` on the cluster's access settings: each problem names its key and what is allowed."""

from __future__ import annotations

import pytest

from fleet.spec.validate import check_spec
from tests.support.stacks import spec


def _problems(environment: str, **cluster: object) -> list[tuple[str, str, str]]:
    """The cluster problems of the aws preset in ``environment`` with ``cluster`` keys (snake_case) changed."""
    base = spec("aws", environment=environment)
    changed = base.model_copy(update={"cluster": base.cluster.model_copy(update=cluster)})
    found = check_spec(changed)
    return [(p.level, p.path, p.message) for p in found if p.path.startswith("llmfleet:cluster.")]


def test_an_internet_wide_endpoint_is_an_error_on_prod() -> None:
    ((level, path, message),) = _problems("prod", public_endpoint_cidrs=["0.0.0.0/0"])
    assert (level, path) == ("error", "llmfleet:cluster.publicEndpointCidrs[0]")
    assert "production" in message and "list your office, VPN or CI egress ranges" in message


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0"])
def test_an_internet_wide_endpoint_is_a_warning_elsewhere(cidr: str) -> None:
    ((level, path, _),) = _problems("staging", public_endpoint_cidrs=[cidr])
    assert (level, path) == ("warning", "llmfleet:cluster.publicEndpointCidrs[0]")


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "office", "10.0.0.1/8"])
def test_a_malformed_cidr_is_an_error_naming_the_form(cidr: str) -> None:
    ((level, path, message),) = _problems("prod", public_endpoint_cidrs=["198.18.0.0/15", cidr])
    assert (level, path) == ("error", "llmfleet:cluster.publicEndpointCidrs[1]")
    assert "CIDR block" in message


def test_a_documentation_range_is_flagged_as_a_placeholder() -> None:
    ((level, _, message),) = _problems("prod", public_endpoint_cidrs=["203.0.113.0/24"])
    assert level == "warning" and "placeholder" in message


def test_role_arns_must_be_iam_roles() -> None:
    problems = _problems(
        "prod",
        admin_role_arns=["arn:aws:iam::123456789012:user/alice"],
        ci_role_arns=["arn:aws:iam::123456789012:role/ci"],
    )
    assert [(level, path) for level, path, _ in problems] == [("error", "llmfleet:cluster.adminRoleArns[0]")]
    assert "IAM role ARN" in problems[0][2]


def test_log_retention_must_be_a_cloudwatch_value() -> None:
    ((level, path, message),) = _problems("prod", log_retention_days=100)
    assert (level, path) == ("error", "llmfleet:cluster.logRetentionDays")
    assert "90, 120" in message


def test_the_defaults_raise_nothing() -> None:
    assert _problems("prod") == []
