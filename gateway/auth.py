"""Auth: map a ``Authorization: Bearer`` key to its tenant; keys are held only as sha256 digests.

A presented key is hashed once, then compared in constant time against every stored digest (no early exit, no
dict lookup on secret-derived data), so response timing says nothing about which digests exist. Tenant
identity comes from the key alone: `FORWARDED_HEADERS` is the only set of client headers that reaches an
engine, so client-sent tenant or priority headers are dropped by construction.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from fleet.spec import KEY_HASH, TenantSpec
from gateway.errors import Unauthorized

__all__ = ["FORWARDED_HEADERS", "KEY_HASHES_FILE", "KeyRing", "hashes_from_file", "keys_from_secret", "secret_env_name"]

# In the secrets directory: JSON {tenant: ["sha256:..."]}, rendered by the Pulumi program from tenants' secrets.
KEY_HASHES_FILE = "tenant-keys.json"

# Client headers passed to the engine; everything else (Authorization, x-tenant, x-priority, ...) is dropped.
FORWARDED_HEADERS = ("x-request-id", "traceparent", "tracestate")


class KeyRing:
    """Digests of API keys -> tenant. Built once at startup; read-only afterwards."""

    def __init__(
        self,
        tenants: Iterable[TenantSpec],
        extra_keys: Mapping[str, Iterable[str]] | None = None,
        extra_hashes: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """``extra_keys``: tenant -> plain keys (from secrets), hashed here and dropped; ``extra_hashes``: tenant ->
        ``sha256:<hex>`` digests (the ``tenant-keys.json`` the Pulumi program mounts). Unknown tenants are skipped
        for hashes (a file may cover several stacks) and rejected for keys."""
        entries: list[tuple[bytes, TenantSpec]] = []
        by_name = {}
        for tenant in tenants:
            by_name[tenant.name] = tenant
            for stored in tenant.api_key_hashes:
                entries.append((_digest(stored), tenant))
        for name, keys in (extra_keys or {}).items():
            if name not in by_name:
                raise ValueError(f"keys given for unknown tenant {name!r}; tenants: {', '.join(sorted(by_name))}")
            entries += [(hashlib.sha256(key.encode()).digest(), by_name[name]) for key in keys]
        for name, hashes in (extra_hashes or {}).items():
            if name in by_name:
                entries += [(_digest(h), by_name[name]) for h in hashes]
        self._entries = tuple(entries)
        self.tenants: Mapping[str, TenantSpec] = by_name

    def __len__(self) -> int:
        return len(self._entries)

    def authenticate(self, authorization: str | None) -> TenantSpec:
        """The tenant owning the bearer key in ``authorization``; Unauthorized when missing or unknown."""
        if not authorization:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
        digest = hashlib.sha256(key.encode()).digest()
        found: TenantSpec | None = None
        for stored, tenant in self._entries:
            if hmac.compare_digest(stored, digest) and found is None:
                found = tenant
        if found is None:
            raise Unauthorized("invalid API key")
        return found


def _digest(stored: str) -> bytes:
    if not KEY_HASH.match(stored):
        raise ValueError(f"not a key hash: expected 'sha256:<64 hex digits>', got {stored[:12]!r}...")
    return bytes.fromhex(stored.removeprefix("sha256:"))


def hashes_from_file(path: Path) -> dict[str, list[str]]:
    """``{tenant: ["sha256:..."]}`` from a JSON file (the ``tenant-keys.json`` Secret); {} when absent."""
    if not path.is_file():
        return {}
    table = json.loads(path.read_text())
    if not isinstance(table, dict) or not all(
        isinstance(v, list) and all(isinstance(h, str) for h in v) for v in table.values()
    ):
        raise ValueError(f"{path}: expected a JSON object of tenant -> list of 'sha256:<hex>'")
    return {str(k): list(v) for k, v in table.items()}


def secret_env_name(secret: str) -> str:
    """``tenantKeys:acme`` -> ``LLMFLEET_SECRET_TENANTKEYS_ACME``."""
    return "LLMFLEET_SECRET_" + "".join(c.upper() if c.isalnum() else "_" for c in secret)


def keys_from_secret(secret: str, env: Mapping[str, str], secrets_dir: Path | None) -> list[str]:
    """Plain keys of a tenant's ``apiKeysSecret``: from the env var `secret_env_name` or a file in ``secrets_dir``.

    The value is a JSON list of strings, or one key per line (blank lines and ``#`` comments skipped). The file is
    ``secrets_dir / secret`` with ':' replaced by '_' (``tenantKeys_acme``), which is how a Kubernetes Secret
    mounted as a volume presents its keys. Returns [] when neither exists.
    """
    text = env.get(secret_env_name(secret))
    if text is None and secrets_dir is not None:
        path = secrets_dir / secret.replace(":", "_").replace("/", "_")
        if path.is_file():
            text = path.read_text()
    if text is None:
        return []
    stripped = text.strip()
    if stripped.startswith("["):
        parsed = json.loads(stripped)
        if not isinstance(parsed, list) or not all(isinstance(k, str) for k in parsed):
            raise ValueError(f"secret {secret!r}: expected a JSON list of strings")
        return [k for k in parsed if k]
    return [line.strip() for line in stripped.splitlines() if line.strip() and not line.strip().startswith("#")]
