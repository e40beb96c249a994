"""Fixtures: offline runs of the shipped stacks (one per stack per session) and resource builders."""

from __future__ import annotations

import functools
from typing import Any

import yaml

from fleet.loader import find_stack
from infra.offline import OfflineRun
from infra.stack_run import offline_run


def stack_document(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load(find_stack(name).read_text()))


@functools.cache
def stack_run(name: str) -> OfflineRun:
    return offline_run(stack_document(name), name)
