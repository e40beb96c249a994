"""Cache salt: the ``cache_salt`` the gateway puts on every request it sends an engine, one per tenant.

vLLM keys its prefix cache by block hashes whose first block takes the request's ``cache_salt`` (from 0.31 on as
the extra key ``("cache_salt", salt)``; every later block inherits it through its parent), so requests with
different salts never share a cached block, and so never time each other's prefill. The gateway sets the salt,
never the client: a tenant cannot pick another tenant's salt.

* **Derivation.** ``salt = base64url(HMAC-SHA256(K, "tenant\\0" + len(name) + name))`` without padding (43
  characters of ``A-Za-z0-9_-``, which vLLM's check accepts: no ``@ / \\`` or NUL, at most 128); a tenant with a
  ``cacheGroup`` gets its group's, ``HMAC(K, "group\\0" + len(group) + group)`` (tenants of one group share a
  cache on purpose; the label keeps a group apart from a tenant of the same name).
* **A client's salt** (a tenant partitioning its own cache further) is combined, never used alone: ``HMAC(K,
  "client\\0" + len(base) + base + client salt)`` with ``base`` the tenant's salt; the lengths keep
  ``("ab", "c")`` and ``("a", "bc")`` apart. A salt vLLM would refuse is the client's 400 (`check_client_salt`).
* **The key** ``K`` is derived from the engines' API key (``LLMFLEET_ENGINE_API_KEY``, which every gateway of a
  fleet holds, as `gateway.response_ids` uses it) under its own label, so every gateway and every restart agree.
  Without one, ``K`` is derived from the empty key: still one salt per tenant on every gateway (clients cannot set
  a salt of their own, so isolation holds), only guessable by whoever reaches the engines directly, which an
  engine with no key lets anyone do anyway.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging

from gateway.errors import BadRequest

__all__ = ["CacheSalts", "check_client_salt"]

log = logging.getLogger("llmfleet.gateway")

_LABEL = b"llmfleet cache salts"
_FORBIDDEN = frozenset("@/\\\x00")  # vLLM's _CACHE_SALT_FORBIDDEN_CHARS
MAX_SALT_LENGTH = 128  # vLLM's _MAX_CACHE_SALT_LENGTH


def check_client_salt(value: object) -> str:
    """A client's ``cache_salt`` as vLLM checks it (a non-empty string of at most 128 characters without ``@``,
    ``/``, ``\\`` or NUL); BadRequest naming ``cache_salt`` otherwise."""
    if not isinstance(value, str) or not value:
        raise BadRequest("'cache_salt' must be a non-empty string if provided", param="cache_salt")
    if len(value) > MAX_SALT_LENGTH or any(char in _FORBIDDEN for char in value):
        raise BadRequest(
            "'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL",
            param="cache_salt",
        )
    return value


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


class CacheSalts:
    """Derives the salts (see the module's docstring); pure, one per gateway."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._tenants: dict[tuple[str, str | None], str] = {}  # a tenant's salt never changes: computed once

    @classmethod
    def from_engine_key(cls, engine_api_key: str | None) -> CacheSalts:
        if not engine_api_key:
            log.info("no engine API key: cache salts are derived under a public key (still one per tenant)")
        return cls(hmac.new((engine_api_key or "").encode(), _LABEL, hashlib.sha256).digest())

    def _mac(self, data: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, data, hashlib.sha256).digest()).rstrip(b"=").decode()

    def for_tenant(self, name: str, cache_group: str | None = None) -> str:
        """The salt of a tenant named ``name`` (of its ``cache_group``, when it has one)."""
        salt = self._tenants.get((name, cache_group))
        if salt is None:
            if cache_group is not None:  # its own label: a group named like a tenant is not that tenant
                salt = self._mac(b"group\0" + _field(cache_group.encode()))
            else:
                salt = self._mac(b"tenant\0" + _field(name.encode()))
            self._tenants[(name, cache_group)] = salt
        return salt

    def combined(self, base: str, client_salt: str | None) -> str:
        """``base`` (a tenant's salt) with the client's own salt folded in; ``base`` itself without one."""
        if client_salt is None:
            return base
        return self._mac(b"client\0" + _field(base.encode()) + client_salt.encode())
