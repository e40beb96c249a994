"""A tenant's ``cacheGroup``: tenants naming one group share one engine prefix cache; unset, each has its own."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleet.spec.stack import TenantSpec
from tests.support.stacks import spec


def test_a_tenant_has_a_cache_of_its_own_unless_it_names_a_group() -> None:
    assert TenantSpec(name="acme").cache_group is None
    assert TenantSpec.model_validate({"name": "acme", "cacheGroup": "partners"}).cache_group == "partners"


def test_the_stack_key_reaches_the_tenant() -> None:
    tenants = spec("gateway", **{"tenants.0.cacheGroup": "team"}).tenants
    assert [t.cache_group for t in tenants] == ["team", None]


@pytest.mark.parametrize("group", ["Team", "a b", "", "x" * 64])
def test_a_group_is_a_dns_label(group: str) -> None:
    with pytest.raises(ValidationError, match="cacheGroup|cache_group"):
        TenantSpec.model_validate({"name": "acme", "cacheGroup": group})
