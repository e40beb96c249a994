"""Fixtures: offline runs of the shipped stacks (one per stack per session) and resource builders."""

from __future__ import annotations

import functools

from infra.offline import OfflineRun
from infra.stack_run import offline_run
from tests.support.stacks import stack_document


@functools.cache
def stack_run(name: str) -> OfflineRun:
    return offline_run(stack_document(name), name)
