"""Validate model names: which pool, adapter or alias serves each name a client sends, and the aliases' weights.

Part of `fleet.spec.validate.check_spec`: every name is served once, an adapter's name is nobody else's, an alias names
existing pools with a positive weight sum and a fallback outside them, and its pools are sized from their share.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleet.spec.errors import Problem, key_error as _err, key_warning as _warn
from fleet.spec.stack import FleetSpec

__all__ = ["check_adapter_routing", "check_aliases", "check_kv_routing", "check_unique_names"]


def check_unique_names(spec: FleetSpec) -> Iterator[Problem]:
    seen: dict[str, int] = {}
    served: dict[str, int] = {}
    served_adapters: dict[str, str] = {}
    for i, pool in enumerate(spec.pools):
        if pool.name in seen:
            yield _err(f"pools[{i}].name", f"duplicate of pools[{seen[pool.name]}]", pool.name)
        seen.setdefault(pool.name, i)
        if pool.served_name in served:
            yield _err(
                f"pools[{i}].servedModelName",
                f"pools[{served[pool.served_name]}] already serves this name",
                pool.served_name,
            )
        served.setdefault(pool.served_name, i)
    # An adapter's name is a model name clients send: one pool serves it, and no pool or alias already does.
    for i, pool in enumerate(spec.pools):
        for j, adapter in enumerate(pool.adapters):
            if adapter.name in served or adapter.name in spec.aliases:
                yield _err(
                    f"pools[{i}].adapters[{j}].name", "a pool or an alias already serves this name", adapter.name
                )
            elif adapter.name in served_adapters:
                yield _err(
                    f"pools[{i}].adapters[{j}].name",
                    f"pool {served_adapters[adapter.name]!r} serves an adapter of this name",
                    adapter.name,
                )
            served_adapters.setdefault(adapter.name, pool.name)


def check_adapter_routing(spec: FleetSpec) -> Iterator[Problem]:
    """Adapters need the serves-adapter filter: without it a request may reach a replica started before its adapter
    was added, which answers 404."""
    with_adapters = [p.name for p in spec.pools if p.adapters]
    if with_adapters and "serves-adapter" not in {f.name for f in spec.gateway.routing.filters}:
        yield _warn(
            "gateway.routing.filters",
            f"pools {with_adapters} serve LoRA adapters: add {{name: serves-adapter}} so their requests reach only "
            "replicas that serve the adapter (and adapter-affinity to the scorers to prefer those holding it)",
        )


def check_kv_routing(spec: FleetSpec) -> Iterator[Problem]:
    """The kv-cache scorer needs, per pool, engines that publish their KV events and a tokenizer the gateway
    tokenizes with: a folder (``engine.tokenizer``), or on aws the model's own from the stack's model bucket
    (`gateway.tokenizer_store`); a pool missing either is routed by the other scorers alone, worth saying."""
    if "kv-cache" not in {s.name for s in spec.gateway.routing.scorers}:
        return
    from_store = spec.target == "aws"  # the only target with a model bucket
    for i, pool in enumerate(spec.pools):
        has_tokenizer = pool.engine.tokenizer is not None or from_store
        missing = [key for key, ok in (("kvEvents", pool.engine.kv_events), ("tokenizer", has_tokenizer)) if not ok]
        if missing:
            yield _warn(
                f"pools[{i}].engine",
                f"gateway.routing scores with kv-cache, but pool {pool.name!r} has no engine."
                + " or engine.".join(missing)
                + ": kv-cache scores nothing for it (set kvEvents: true and tokenizer: FOLDER)",
            )


def check_aliases(spec: FleetSpec) -> Iterator[Problem]:
    """Aliases name existing pools, and a name a pool serves is an alias only of weights that include that pool
    (the canary of a served name), so no request for a pool's name is silently sent to another."""
    pools = {p.name: p for p in spec.pools}
    known = ", ".join(pools)
    for alias, entry in spec.aliases.items():
        path = f"aliases.{alias}"
        elsewhere = entry.fallback is not None or sum(1 for w in entry.pools.values() if w > 0) > 1
        for name, weight in entry.pools.items():
            if name not in pools:
                yield _err(f"{path}.pools.{name}", f"no such pool; pools: {known}", name)
            elif weight > 0 and pools[name].replicas.min == 0 and elsewhere:
                yield _warn(
                    f"{path}.pools.{name}",
                    "replicas.min is 0: while the pool has no ready replica its share is served elsewhere (the "
                    "fallback, the other pools), so it sees no demand to start from; give it replicas.min >= 1",
                )
        if sum(entry.pools.values()) == 0:
            yield _err(f"{path}.pools", "the weights sum to 0: give at least one pool a positive weight")
        if entry.fallback is not None and entry.fallback not in pools:
            yield _err(f"{path}.fallback", f"no such pool; pools: {known}", entry.fallback)
        elif entry.fallback in entry.pools:
            yield _err(
                f"{path}.fallback",
                "one of the alias's pools; name a pool outside them (they are tried after the fallback anyway)",
                entry.fallback,
            )
        yield from _check_alias_demand(spec, path, entry.pools)
        behind = [pools[n] for n in [*entry.pools, entry.fallback] if n in pools]
        runners = sorted({p.engine.runner for p in behind})
        if len(runners) > 1:  # an embedding and a generative pool cannot answer the same requests
            named = ", ".join(f"{p.name} ({p.engine.runner})" for p in behind)
            yield _err(path, f"its pools mix engine runners: {named}; an alias's pools all generate or all pool")
        for pool in spec.pools:
            if alias in (pool.served_name, pool.model) and pool.name not in entry.pools:
                yield _err(
                    path,
                    f"pool {pool.name!r} serves this name: an alias may take a pool's name only when its pools "
                    f"include that pool (e.g. pools: {{{pool.name}: 95, <new pool>: 5}})",
                    alias,
                )


def _check_alias_demand(spec: FleetSpec, path: str, weights: dict[str, int]) -> Iterator[Problem]:
    """Each pool is sized from its own ``workload.peakQps``: behind an alias, that should be about its weight's share
    of the alias's peak (taken as the weighted pools' peaks summed), or the canary is sized like the whole."""
    pools = {p.name: p for p in spec.pools}
    weighted = {name: w for name, w in weights.items() if w > 0 and name in pools}
    total_weight = sum(weighted.values())
    peak = sum(pools[name].workload.peak_qps for name in weighted)
    if peak <= 0 or total_weight <= 0:
        return
    for name, weight in weighted.items():
        share = peak * weight / total_weight
        declared = pools[name].workload.peak_qps
        if declared > 2 * share or declared < share / 2:
            yield _warn(
                f"{path}.pools.{name}",
                f"workload.peakQps {declared:g} is not its weight's share of the alias's peak: {weight} of "
                f"{total_weight} of {peak:g} QPS (the weighted pools' peaks summed) is {share:.3g}; plan sizes each "
                "pool from its own peakQps",
            )
