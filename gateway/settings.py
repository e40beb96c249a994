"""Settings: everything a gateway process needs, resolved once at the edge (CLI or tests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleet.protocol.control_auth import ENGINE_API_KEY_ENV, ClientCredential
from fleet.spec.stack import FleetSpec
from fleet.tokenizer import ModelTokenizer

__all__ = ["GatewaySettings"]


@dataclass(frozen=True)
class GatewaySettings:
    spec: FleetSpec
    static_replicas: Mapping[str, Sequence[str]] = field(default_factory=dict)  # pool -> engine URLs
    # pool -> KV event sockets, the i-th the i-th static replica's (`replicas_of`); discovery names them otherwise
    static_kv_events: Mapping[str, Sequence[str]] = field(default_factory=dict)
    control_plane: str | None = None  # discovery source; None: static replicas only
    extra_keys: Mapping[str, Sequence[str]] = field(default_factory=dict)  # tenant -> plain keys (from secrets)
    extra_hashes: Mapping[str, Sequence[str]] = field(default_factory=dict)  # tenant -> sha256 digests
    access_log: bool = True
    routing_seed: int | None = None  # fixes the pickers' random draws (tests, benchmarks)
    redis_url: str | None = None  # the quota Redis; overrides gateway.redisUrl (from a Secret, so never in the stack)
    # on every control-plane call: reports, discovery, alias weights ($LLMFLEET_CONTROL_TOKEN[_FILE], gateway.cli)
    control_credential: ClientCredential | None = None
    engine_api_key: str | None = field(default=None, repr=False)  # sent upstream ($LLMFLEET_ENGINE_API_KEY)
    # pool -> its tokenizer from the model store, for pools without engine.tokenizer (`gateway.tokenizer_store`)
    tokenizers: Mapping[str, ModelTokenizer] = field(default_factory=dict, repr=False)

    @staticmethod
    def engine_api_key_from(env: Mapping[str, str]) -> str | None:
        """The engines' API key from ``$LLMFLEET_ENGINE_API_KEY`` (None when unset or empty)."""
        return env.get(ENGINE_API_KEY_ENV) or None

    @property
    def quota_redis_url(self) -> str | None:
        """Where shared quotas live: `redis_url`, else the stack's ``gateway.redisUrl``."""
        return self.redis_url or self.spec.gateway.redis_url

    def replicas_of(self, pool: str) -> list[str]:
        """Engine URLs of ``pool``: the stack's staticReplicas plus any given on the command line."""
        listed = list(self.spec.pool(pool).static_replicas)
        return listed + [u for u in self.static_replicas.get(pool, []) if u not in listed]
