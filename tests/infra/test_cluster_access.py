"""Cluster access: explicit access entries only, so the creating role's entry never collides with an implicit one.

EKS makes an access entry for the creating identity when ``bootstrapClusterCreatorAdminPermissions`` is true;
creating another entry for that principal then fails with 409 ``ResourceInUseException``
(terraform-aws-modules/terraform-aws-eks#3293, pulumi/pulumi-eks#2373).
"""

from __future__ import annotations

import pytest

from infra.cluster import CLUSTER_ADMIN_POLICY, access_entry_principals
from tests.infra.registrations import registrations

CLUSTER = "aws:eks/cluster:Cluster"
ENTRY = "aws:eks/accessEntry:AccessEntry"
ASSOCIATION = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
ADMIN = "arn:aws:iam::111122223333:role/llmfleet-admin"
CI = "arn:aws:iam::111122223333:role/llmfleet-ci"


def test_the_cluster_grants_its_creator_nothing_implicitly_and_keeps_an_old_clusters_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = registrations(monkeypatch)
    ((cluster, options),) = found.of(CLUSTER)
    assert cluster.props["accessConfig"] == {
        "authenticationMode": "API",
        "bootstrapClusterCreatorAdminPermissions": False,
    }
    # The flag is create-only: flipping it on a cluster made with `true` would replace the cluster.
    assert "accessConfig.bootstrapClusterCreatorAdminPermissions" in options.ignore_changes


def test_every_listed_role_gets_one_entry_and_admin_even_when_listed_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    run = registrations(monkeypatch, **{"cluster.adminRoleArns": [ADMIN, CI], "cluster.ciRoleArns": [CI, CI]}).run
    principals = [e.props["principalArn"] for e in run.of_type(ENTRY)]
    assert sorted(principals) == sorted([ADMIN, CI])  # a second entry for CI would be refused as in use
    associations = run.of_type(ASSOCIATION)
    assert sorted(a.props["principalArn"] for a in associations) == sorted([ADMIN, CI])
    assert {a.props["policyArn"] for a in associations} == {CLUSTER_ADMIN_POLICY}


@pytest.mark.parametrize(
    ("admins", "ci", "expected"),
    [
        ([ADMIN], [CI], [("admin", 0, ADMIN), ("ci", 0, CI)]),
        ([ADMIN], [ADMIN, CI], [("admin", 0, ADMIN), ("ci", 1, CI)]),  # CI keeps its index: stable names
        ([], [], []),
    ],
)
def test_access_entry_principals_are_distinct_and_keep_their_names(
    admins: list[str], ci: list[str], expected: list[tuple[str, int, str]]
) -> None:
    assert access_entry_principals(admins, ci) == expected
