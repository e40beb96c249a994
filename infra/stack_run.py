"""Stack run: a stack document's config run through the real Pulumi program under mocks (`infra.offline`).

What ``pulumi preview -s STACK`` would register, without the CLI or a cloud: the policy check and the program's
tests read the recorded resources. Secrets the CLI would decrypt are replaced by placeholders: tenant keys (only
their hashes reach resources), the quota Redis' password and the engines' API key; capacity-block groups get a
placeholder reservation id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.spec.loader import parse_spec
from infra.config import (
    ENGINE_API_KEY_CONFIG,
    capacity_reservations,
    redis_auth_token,
    redis_secret_keys,
    spec_from_config,
    stack_config,
    tenant_key_hashes,
    tenant_secret_keys,
)
from infra.offline import OfflineRun, run_offline
from infra.program import FleetInputs, build_fleet
from llmfleet.registries import all_registries

__all__ = [
    "PLACEHOLDER_ENGINE_API_KEY",
    "PLACEHOLDER_KEYS",
    "PLACEHOLDER_REDIS_TOKEN",
    "offline_config",
    "offline_run",
]

PLACEHOLDER_KEYS = '["sk-offline-placeholder"]'
PLACEHOLDER_REDIS_TOKEN = "offline-placeholder-redis-token"
PLACEHOLDER_ENGINE_API_KEY = "offline-placeholder-engine-api-key"


def offline_config(document: Mapping[str, Any], stack: str) -> tuple[dict[str, str], list[str]]:
    """The config a ``pulumi up`` of ``document`` would see, with placeholders for the secrets and capacity
    reservations it does not hold; and the keys that are secrets."""
    spec = parse_spec(document, name=stack, registries=all_registries()).spec
    config = stack_config(document)
    secrets = tenant_secret_keys(spec)
    for key in secrets:
        config.setdefault(key, PLACEHOLDER_KEYS)
    for key in redis_secret_keys(spec):
        config.setdefault(key, PLACEHOLDER_REDIS_TOKEN)
        secrets.append(key)
    if spec.target != "local":
        config.setdefault(ENGINE_API_KEY_CONFIG, PLACEHOLDER_ENGINE_API_KEY)
        secrets.append(ENGINE_API_KEY_CONFIG)
    for group in spec.gpu_node_groups:
        if group.capacity_type == "capacity-block":
            for zone in spec.zones_of(group):
                config.setdefault(f"capacityBlocks:{group.name}-{zone}", "cr-00000000000000000")
    return config, secrets


def offline_run(document: Mapping[str, Any], stack: str) -> OfflineRun:
    """Run the Pulumi program for ``document`` (a parsed stack file) under mocks; every resource recorded."""
    region = parse_spec(document, name=stack, registries=all_registries()).spec.region
    config, secrets = offline_config(document, stack)

    def program() -> Mapping[str, Any]:
        loaded = spec_from_config(stack)
        return build_fleet(
            FleetInputs(loaded, tenant_key_hashes(loaded), capacity_reservations(loaded), redis_auth_token(loaded))
        )

    return run_offline(program, config, stack=stack, secret_keys=secrets, region=region)
