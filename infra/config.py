"""Config: the FleetSpec from Pulumi config (the ``llmfleet:*`` keys), and tenant keys from secrets.

Pulumi hands structured config values to the program as JSON strings; `spec_from_config` turns them back
into the stack document and validates it with `fleet.spec.loader.parse_spec`, so `pulumi up` rejects exactly what
`llmfleet validate` rejects, and on ``pulumi up`` of a target-aws stack also rejects the placeholders
(`fleet.spec.placeholders`) that ``llmfleet validate`` only warns about. Secrets: tenants' keys (only their hashes
leave this module), the quota Redis' password, and the engines' API key (``engines:apiKey``,
`ENGINE_API_KEY_CONFIG`). `stack_config` goes the other way (a stack file -> the flat map the engine passes the
program), which is how the offline run feeds a stack file to the real program.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import get_monitor

from fleet.protocol.keys import hash_api_key
from fleet.spec.errors import SpecError
from fleet.spec.loader import NAMESPACE, parse_spec
from fleet.spec.placeholders import placeholder_problems
from fleet.spec.stack import FleetSpec
from infra.quota_redis import provisions_redis
from llmfleet.registries import all_registries

__all__ = [
    "ENGINE_API_KEY_CONFIG",
    "capacity_reservations",
    "engine_api_key",
    "redis_auth_token",
    "redis_secret_keys",
    "spec_from_config",
    "stack_config",
    "tenant_key_hashes",
    "tenant_secret_keys",
]

ENGINE_API_KEY_CONFIG = "engines:apiKey"  # Pulumi secret config: the key engines require and gateways send


def _config_value(raw: str) -> Any:
    # Objects and lists arrive JSON-encoded; scalars arrive as plain strings (the model coerces them).
    text = raw.strip()
    if text[:1] in ("[", "{"):
        return json.loads(text)
    return raw


def under_mocks() -> bool:
    """True when the program runs under `pulumi.runtime.set_mocks` (the tests, ``llmfleet policy``): they run
    with ``preview=False``, like a real ``pulumi up``, so only the monitor tells them apart."""
    return isinstance(get_monitor(), MockMonitor)


def spec_from_config(stack: str, strict_placeholders: bool | None = None) -> FleetSpec:
    """Read every ``llmfleet:<key>`` the FleetSpec declares; raise SpecError listing every problem.

    On target aws, placeholders (account 000000000000, all-zero digests, documentation CIDRs) are errors when
    ``strict_placeholders`` is true, by default on a real ``pulumi up`` (neither a preview nor `under_mocks`):
    AWS would refuse them only after the cluster exists. A real preview logs them as warnings.
    """
    config = pulumi.Config(NAMESPACE)
    values: dict[str, Any] = {}
    for name, field in FleetSpec.model_fields.items():
        key = field.alias or name
        raw = config.get(key)
        if raw is not None:
            values[f"{NAMESPACE}:{key}"] = _config_value(raw)
    region = pulumi.Config("aws").get("region")
    if region is not None:
        values["aws:region"] = region
    file = f"Pulumi.{stack}.yaml (config)"
    spec = parse_spec({"config": values}, file=file, name=stack, registries=all_registries()).spec
    if spec.target != "aws":
        return spec
    mocked = under_mocks()
    strict = (not pulumi.runtime.is_dry_run() and not mocked) if strict_placeholders is None else strict_placeholders
    placeholders = [dataclasses.replace(p, file=file) for p in placeholder_problems(spec, level="error")]
    if placeholders and strict:
        raise SpecError(file, placeholders)
    if not mocked:
        for problem in placeholders:
            pulumi.log.warn(f"{problem.render()} (an error on `pulumi up`)")
    return spec


def stack_config(document: Mapping[str, Any]) -> dict[str, str]:
    """A stack document's ``config:`` block as the engine passes it: ``ns:key`` -> string or JSON string."""
    out: dict[str, str] = {}
    for key, value in dict(document.get("config") or {}).items():
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            continue  # ciphertext only the Pulumi CLI can decrypt
        out[str(key)] = value if isinstance(value, str) else json.dumps(value)
    return out


def tenant_secret_keys(spec: FleetSpec) -> list[str]:
    """The secret config keys (``namespace:key``) holding tenants' API keys."""
    return [t.api_keys_secret for t in spec.tenants if t.api_keys_secret is not None]


def _secret(key: str) -> pulumi.Output[str]:
    namespace, _, name = key.rpartition(":")
    return pulumi.Config(namespace or NAMESPACE).require_secret(name)


def _hashes(raw: str) -> list[str]:
    """A secret holds one key or a JSON list of keys; only their sha256 forms leave this function."""
    text = raw.strip()
    keys = json.loads(text) if text.startswith("[") else [text]
    return [hash_api_key(str(k)) for k in keys]


def tenant_key_hashes(spec: FleetSpec) -> pulumi.Output[str]:
    """JSON ``{tenant: ["sha256:..."]}``: the stack's hashes plus the hashes of the keys in secrets (secret)."""
    names: list[str] = []
    secrets: list[pulumi.Output[str]] = []
    for tenant in spec.tenants:
        if tenant.api_keys_secret is not None:
            names.append(tenant.name)
            secrets.append(_secret(tenant.api_keys_secret))

    def render(values: list[str]) -> str:
        table = {t.name: list(t.api_key_hashes) for t in spec.tenants}
        for name, raw in zip(names, values, strict=True):
            table[name] = sorted(set(table[name]) | set(_hashes(raw)))
        return json.dumps(table, sort_keys=True)

    return pulumi.Output.secret(pulumi.Output.all(*secrets).apply(lambda vs: render([str(v) for v in vs])))


def redis_secret_keys(spec: FleetSpec) -> list[str]:
    """The secret config key (``namespace:key``) of the quota Redis' password, when the program provisions it."""
    return [spec.gateway.redis.auth_token_secret] if provisions_redis(spec) else []


def redis_auth_token(spec: FleetSpec) -> pulumi.Output[str] | None:
    """The quota Redis' password (secret), when the program provisions the Redis; missing config fails."""
    keys = redis_secret_keys(spec)
    return _secret(keys[0]) if keys else None


def engine_api_key() -> pulumi.Output[str]:
    """The engines' API key (secret); a missing ``engines:apiKey`` fails the program with ConfigMissingError."""
    return _secret(ENGINE_API_KEY_CONFIG)


def capacity_reservations(spec: FleetSpec) -> dict[str, str]:
    """``capacityBlocks:<group>-<zone>`` (a ``cr-...`` id) for each zone of each capacity-block GPU group."""
    config = pulumi.Config("capacityBlocks")
    found: dict[str, str] = {}
    for group in spec.gpu_node_groups:
        if group.capacity_type != "capacity-block":
            continue
        for zone in spec.zones_of(group):
            value = config.get(f"{group.name}-{zone}")
            if value:
                found[f"{group.name}-{zone}"] = value
    return found
