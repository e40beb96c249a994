"""Fixtures: one offline program run per shipped stack, shared by every test in this folder.

Pulumi's mock runtime is process-global; `infra.offline.run_offline` installs fresh mocks per run and drains
every registration before returning, so cached runs never see each other's resources.
"""

from __future__ import annotations

import functools

import pytest

from fleet.spec.loader import load_spec
from fleet.spec.stack import FleetSpec
from infra.offline import OfflineRun
from infra.stack_run import offline_run
from tests.support.stacks import stack_document


@functools.cache
def stack_run(name: str) -> OfflineRun:
    return offline_run(stack_document(name), name)


@pytest.fixture(scope="session")
def prod() -> OfflineRun:
    return stack_run("prod")


@pytest.fixture(scope="session")
def prod_spec() -> FleetSpec:
    return load_spec("prod").spec


@pytest.fixture(scope="session")
def dev() -> OfflineRun:
    return stack_run("dev")
