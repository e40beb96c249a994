"""Tenants: a trace split among N tenants, replayed with a prefix cache per tenant (isolated) or one shared cache.

The gateway sends every request with its tenant's ``cache_salt`` (`gateway.cache_salt`), so tenants never share a
cached block unless the stack puts them in one ``cacheGroup``. What that costs is the prefix reuse between
tenants: `split` gives each request of a trace a tenant, and the replay runs it twice, the same fleet and plan,
once with each request salted by its tenant (``isolated``) and once unsalted (``shared``: one cache group).

* **Who sent what.** ``tenant-k`` with ``k = blake2b(seed, key) mod N``. The key is the request's conversation
  where a trace has one; none of the shipped traces does (Azure has token counts only, Mooncake prefix-block ids),
  so the key is the request itself (its line in the file; a ``--rate-scale`` copy keeps its original's tenant).
  Tenants then draw requests independently, and two requests that share a prefix belong to one tenant with
  probability 1/N: the cost's upper end. Where each tenant owns the prefixes it reuses (its system prompts, its
  conversations) salts cost nothing.
* **Salts** are the gateway's own (`gateway.cache_salt.CacheSalts` under an empty engine key), so the replicas'
  prefix caches, their KV events and every prefix scorer (``kv-cache``, ``prefix-affinity``, the oracle) key a
  request's blocks exactly as in the fleet.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import replace

from gateway.cache_salt import CacheSalts
from simulate.bounds import infinite_cache_hit_rate
from simulate.replay import Prepared
from simulate.report import Row
from simulate.trace import TraceRequest

__all__ = ["MAX_TENANTS", "cost_lines", "isolated", "request_key", "split", "tenant_of"]

MAX_TENANTS = 10_000


def request_key(request: TraceRequest) -> str:
    """The key a request's tenant is drawn from: its id, without the ``.i`` of a rate-scaled copy."""
    base, dot, copy = request.rid.rpartition(".")
    return base if dot and copy.isdigit() else request.rid


def tenant_of(key: str, tenants: int, seed: int) -> str:
    """The tenant of ``key`` among ``tenants`` (``tenant-0`` ...), the same on every run with the same seed."""
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return f"tenant-{int.from_bytes(digest, 'big') % tenants}"


def split(trace: Sequence[TraceRequest], tenants: int, seed: int, *, isolated: bool) -> list[TraceRequest]:
    """``trace`` with each request's tenant set; ``isolated``: with its tenant's cache salt as well."""
    if not 1 <= tenants <= MAX_TENANTS:
        raise ValueError(f"--tenants {tenants}: give 1 to {MAX_TENANTS}")
    salts = CacheSalts.from_engine_key(None)
    out = []
    for r in trace:
        tenant = tenant_of(request_key(r), tenants, seed)
        out.append(replace(r, tenant=tenant, cache_salt=salts.for_tenant(tenant) if isolated else None))
    return out


def isolated(prepared: Prepared, tenants: int, seed: int) -> Prepared:
    """``prepared`` (its trace split among ``tenants`` by `split`, unsalted) with each request salted by its tenant:
    the same fleet, plan and yardsticks, only the caches apart (and the infinite cache's ceiling, per tenant)."""
    trace = tuple(split(prepared.trace, tenants, seed, isolated=True))
    return replace(prepared, trace=trace, cache_ceiling=infinite_cache_hit_rate(trace))


def cost_lines(shared: Sequence[Row], isolated: Sequence[Row]) -> list[str]:
    """One line per configuration: its prefix hit rate and TTFT with one shared cache and with a cache per tenant."""

    def ms(value: float | int | str) -> str:
        return "-" if math.isnan(float(value)) else f"{float(value) * 1000:.0f}ms"

    lines = []
    for one, own in zip(shared, isolated, strict=True):
        lines.append(
            f"  {one['routing']!s} / {one['scaling']!s}: hit {float(one['hit']):.1%} shared -> "
            f"{float(own['hit']):.1%} isolated; TTFT p50 {ms(one['ttft_p50'])} -> {ms(own['ttft_p50'])}, "
            f"p99 {ms(one['ttft_p99'])} -> {ms(own['ttft_p99'])}; in-SLO {float(one['within_slo']):.2%} -> "
            f"{float(own['within_slo']):.2%}"
        )
    return lines
