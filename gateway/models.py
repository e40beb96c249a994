"""Models: which pool serves a model name (a pool's served name or model, a LoRA adapter, an alias), and who may
use it.

A name resolves in this order: an alias (`gateway.routing.aliases`, whose weights a rollout may change at run
time), a pool's served name, a pool's model (the first pool serving it), a LoRA adapter (served by its pool). A
tenant's ``allowedModels`` admits a pool by its served name or model, an alias or an adapter by its own name
only, and everything with ``*``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fleet.spec.stack import PoolSpec, TenantSpec
from gateway.errors import ModelNotAllowed, ModelNotFound
from gateway.routing.aliases import AliasTable, WeightedAlias
from gateway.routing.base import RequestInfo

__all__ = ["Models", "may_use", "may_use_alias"]


class Models:
    """The model names this gateway serves. ``has_ready(pool)``: whether the pool has a routable replica (an
    alias prefers such pools)."""

    def __init__(self, pools: Sequence[PoolSpec], aliases: AliasTable, has_ready: Callable[[str], bool]) -> None:
        self.pools = list(pools)
        self._by_pool = {p.name: p for p in pools}
        self._by_name: dict[str, PoolSpec] = {}
        for pool in pools:
            self._by_name.setdefault(pool.model, pool)
        self._by_name.update({p.served_name: p for p in pools})
        self._adapters = {a.name: p for p in pools for a in p.adapters}  # LoRA adapter -> its pool
        self._has_ready = has_ready
        self.aliases = AliasTable()
        self.set_aliases(aliases)

    def set_aliases(self, table: AliasTable) -> None:
        """Serve ``table``'s aliases from now on (requests already routed keep their pool); ValueError, and the
        current table kept, when it names a pool this gateway does not know."""
        unknown = sorted({p for alias in table for p in alias.pools} - set(self._by_pool))
        if unknown:
            raise ValueError(f"aliases name unknown pools {unknown}; pools: {', '.join(sorted(self._by_pool))}")
        self.aliases = table

    def pool(self, name: str) -> PoolSpec:
        """The pool named ``name`` (KeyError for one this gateway does not serve)."""
        return self._by_pool[name]

    def is_adapter(self, model: str) -> bool:
        """Whether ``model`` is the name of a LoRA adapter (the request then names it to its engine)."""
        return model in self._adapters

    def resolve(self, model: str, tenant: TenantSpec, info: RequestInfo) -> tuple[PoolSpec, WeightedAlias | None]:
        """The pool that serves ``model``, and the alias it came through: an alias's pool for the request ``info``
        (`AliasTable.resolve`, preferring pools with a ready replica), else the pool serving that name.
        ModelNotFound for a name nothing serves, ModelNotAllowed for one the tenant may not use."""
        alias = self.aliases.get(model)
        if alias is not None:
            if not may_use_alias(tenant, alias.name):
                raise _denied(tenant, model)
            return self._by_pool[self.aliases.resolve(alias, info, self._has_ready)], alias
        pool = self._by_name.get(model)
        if pool is None and model in self._adapters:  # a LoRA adapter: allowed by its own name, not its base's
            if not ("*" in tenant.allowed_models or model in tenant.allowed_models):
                raise _denied(tenant, model)
            return self._adapters[model], None
        if pool is None:
            raise ModelNotFound(f"the model '{model}' does not exist", param="model")
        if not may_use(tenant, pool):
            raise _denied(tenant, model)
        return pool, None

    def listed(self, tenant: TenantSpec) -> list[dict[str, Any]]:
        """``GET /v1/models``'s entries for ``tenant``: its pools, then its aliases not named like a pool."""
        data: list[dict[str, Any]] = [
            {"id": pool.served_name, "object": "model", "created": 0, "owned_by": "llmfleet", "root": pool.model}
            for pool in self.pools
            if may_use(tenant, pool)
        ]
        # An alias is a model like any other to a client; `model` in its answers names the pool that served.
        data += [
            {"id": alias.name, "object": "model", "created": 0, "owned_by": "llmfleet"}
            for alias in self.aliases
            if may_use_alias(tenant, alias.name) and alias.name not in {m["id"] for m in data}
        ]
        return data


def _denied(tenant: TenantSpec, model: str) -> ModelNotAllowed:
    return ModelNotAllowed(f"tenant '{tenant.name}' may not use model '{model}'", param="model")


def may_use(tenant: TenantSpec, pool: PoolSpec) -> bool:
    """Whether the tenant's ``allowedModels`` admit the pool (by served name or model, or ``*``)."""
    allowed = tenant.allowed_models
    return "*" in allowed or pool.served_name in allowed or pool.model in allowed


def may_use_alias(tenant: TenantSpec, alias: str) -> bool:
    """Whether the tenant's ``allowedModels`` admit the alias (by its name, or ``*``); its pools need no entry."""
    return "*" in tenant.allowed_models or alias in tenant.allowed_models
