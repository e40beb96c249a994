"""Auth: map a ``Authorization: Bearer`` key to its tenant; keys are held only as sha256 digests.

A presented key is hashed once, then compared in constant time against every stored digest (no early exit, no
dict lookup on secret-derived data), so response timing says nothing about which digests exist. Tenant
identity comes from the key alone: `FORWARDED_HEADERS` is the only set of client headers that reaches an
engine, so client-sent tenant or priority headers are dropped by construction.

Rotation: the ``tenant-keys.json`` table comes through `KeyHashesFile`, which re-reads the file when it changes.
Kubernetes rewrites a mounted Secret in place (the kubelet's periodic sync, about a minute), so a key removed from
the Secret by ``pulumi up`` is refused within that sync plus `KeyHashesFile.check_interval_s`, before the
gateways' rollout (their pod template's checksum, `infra.gateway_tier`) even ends.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from fleet.protocol.clock import Clock, SystemClock
from fleet.spec.stack import KEY_HASH, TenantSpec
from gateway.errors import Unauthorized

__all__ = [
    "FORWARDED_HEADERS",
    "KEY_HASHES_FILE",
    "KeyHashesFile",
    "KeyRing",
    "hashes_from_file",
    "keys_from_secret",
    "secret_env_name",
]

log = logging.getLogger("llmfleet.gateway")

# In the secrets directory: JSON {tenant: ["sha256:..."]}, rendered by the Pulumi program from tenants' secrets.
KEY_HASHES_FILE = "tenant-keys.json"

# Client headers passed to the engine; everything else (Authorization, x-tenant, x-priority, ...) is dropped.
FORWARDED_HEADERS = ("x-request-id", "traceparent", "tracestate")


class KeyHashesFile(Mapping[str, Sequence[str]]):
    """``{tenant: ["sha256:..."]}`` from a JSON file, re-read when the file changes.

    `generation` stats the file at most every ``check_interval_s`` seconds of ``clock`` and re-reads it when its
    inode, size or mtime differs (a Secret volume swaps a symlink, so the inode changes). A missing file is an
    empty table; a file that does not parse keeps the last good table (logged), so a bad write never locks every
    tenant out. `generation` grows by one at each table actually read.
    """

    def __init__(self, path: Path, check_interval_s: float = 5.0, clock: Clock | None = None) -> None:
        self.path = path
        self.check_interval_s = check_interval_s
        self._clock = clock or SystemClock()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = -float("inf")
        self._generation = 0
        self._table: dict[str, list[str]] = {}
        self._reload(self._stat())

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _reload(self, stamp: tuple[int, int, int] | None) -> None:
        self._stamp = stamp
        try:
            table = hashes_from_file(self.path) if stamp is not None else {}
        except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            log.error("tenant key table %s unreadable (%s): keeping the previous one", self.path, exc)
            return
        self._table = table
        self._generation += 1

    @property
    def generation(self) -> int:
        """The table's version, after a re-read if the file changed (checked at most every check_interval_s)."""
        now = self._clock.monotonic()
        if now - self._checked >= self.check_interval_s:
            self._checked = now
            stamp = self._stat()
            if stamp != self._stamp:
                self._reload(stamp)
        return self._generation

    def __getitem__(self, tenant: str) -> Sequence[str]:
        return self._table[tenant]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


class KeyRing:
    """Digests of API keys -> tenant. Built at startup; the digests of a `KeyHashesFile` follow the file."""

    def __init__(
        self,
        tenants: Iterable[TenantSpec],
        extra_keys: Mapping[str, Iterable[str]] | None = None,
        extra_hashes: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """``extra_keys``: tenant -> plain keys (from secrets), hashed here and dropped; ``extra_hashes``: tenant ->
        ``sha256:<hex>`` digests (the ``tenant-keys.json`` the Pulumi program mounts; a `KeyHashesFile` is
        re-read when it changes). Unknown tenants are skipped for hashes (a file may cover several stacks) and
        rejected for keys."""
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
        self._fixed = tuple(entries)
        self.tenants: Mapping[str, TenantSpec] = by_name
        # Not `extra_hashes or {}`: an empty KeyHashesFile is falsy and may fill up later.
        self._hashes: Mapping[str, Iterable[str]] = {} if extra_hashes is None else extra_hashes
        self._generation = self._hashes_generation()
        self._entries = self._fixed + self._hash_entries()

    def _hashes_generation(self) -> int | None:
        return self._hashes.generation if isinstance(self._hashes, KeyHashesFile) else None

    def _hash_entries(self) -> tuple[tuple[bytes, TenantSpec], ...]:
        entries: list[tuple[bytes, TenantSpec]] = []
        for name, hashes in self._hashes.items():
            if name in self.tenants:
                entries += [(_digest(h), self.tenants[name]) for h in hashes]
        return tuple(entries)

    def _refresh(self) -> None:
        generation = self._hashes_generation()
        if generation == self._generation:
            return
        try:
            entries = self._hash_entries()
        except ValueError as exc:  # a malformed digest: keep the keys that worked
            log.error("tenant key table rejected (%s): keeping the previous keys", exc)
            return
        self._generation = generation
        self._entries = self._fixed + entries
        log.info("tenant key table reloaded: %d keys", len(self._entries))

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
        self._refresh()
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
