"""``llmfleet plan``'s prefill/decode verdict: per pool, whether disaggregation pays for its declared traffic, why,
and the figures behind it, as text and as JSON.

The threshold is ``--pd-threshold`` when given, else the pool's ``disaggregation.thresholdTokens``, else older
Dynamo's 1000. For a pool the stack already disaggregates, the verdict also sets the counts the targets ask for
against the stack's ``prefill.replicas`` and ``replicas`` bounds: a prefill role capped below what the TTFT target
needs misses it at peak, and a decode role's bound the same for the inter-token target.
"""

from __future__ import annotations

from dataclasses import asdict

from fleet.capacity.disagg_plan import RoleSizing, Verdict, pool_verdict
from fleet.capacity.disagg_split import prefill_bounds, stack_threshold
from fleet.capacity.plan import output_tokens
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["PoolPd", "pd_json", "pool_pd", "render_pd"]

PoolPd = tuple[PoolSpec, int, RoleSizing, Verdict, tuple[str, ...]]


def _bound_lines(pool: PoolSpec, sizing: RoleSizing) -> tuple[str, ...]:
    """What the stack's role bounds do to the counts the targets ask for (a disaggregated pool only)."""
    if pool.disaggregation is None:
        return ()
    low, high = prefill_bounds(pool)
    lines = [
        f"the stack disaggregates this pool: prefill.replicas {low}..{high}, decode replicas "
        f"{pool.replicas.min}..{pool.replicas.max}, thresholdTokens {pool.disaggregation.threshold_tokens}"
    ]
    prefill_fits = low <= sizing.prefill and (high is None or sizing.prefill <= high)
    decode_fits = pool.replicas.min <= sizing.decode <= pool.replicas.max
    if not prefill_fits:
        word = "under" if high is not None and sizing.prefill > high else "over"
        key = "max" if word == "under" else "min"
        why = "remote prompts queue for prefill and miss it" if word == "under" else "the floor pays for more"
        lines.append(
            f"prefill.replicas.{key} {high if key == 'max' else low} is {word} the {sizing.prefill} prefill "
            f"replicas the TTFT target asks for at peak: {why}"
        )
    if not decode_fits:
        word = "under" if sizing.decode > pool.replicas.max else "over"
        key = "max" if word == "under" else "min"
        why = "streams miss it" if word == "under" else "the floor pays for more"
        lines.append(
            f"replicas.{key} {pool.replicas.max if key == 'max' else pool.replicas.min} is {word} the "
            f"{sizing.decode} decode replicas the inter-token target asks for at peak: {why}"
        )
    if prefill_fits and decode_fits:
        lines.append(
            f"the {sizing.prefill} prefill and {sizing.decode} decode replicas the targets ask for at peak fit "
            "the stack's bounds"
        )
    return tuple(lines)


def pool_pd(spec: FleetSpec, threshold: int | None) -> list[PoolPd]:
    """Per generating pool: (pool, its threshold, both roles' sizing, the verdict, the stack's bounds' lines)."""
    out: list[PoolPd] = []
    for pool in spec.pools:
        if output_tokens(pool) == 0:
            continue  # a pooling engine (embeddings) only prefills: nothing to split
        at = threshold if threshold is not None else stack_threshold(pool)
        sizing, found = pool_verdict(spec, pool, at)
        out.append((pool, at, sizing, found, _bound_lines(pool, sizing)))
    return out


def render_pd(spec: FleetSpec, threshold: int | None = None) -> str:
    """The verdicts as ``llmfleet plan`` prints them."""
    lines = []
    for pool, at, _, found, bounds in pool_pd(spec, threshold):
        lines.append(f"\nprefill/decode disaggregation, pool {pool.name} (threshold {at} uncached tokens):")
        lines += [f"  {reason}" for reason in (*found.reasons, *bounds)]
    return "\n".join(lines)


def pd_json(spec: FleetSpec, threshold: int | None = None) -> list[dict[str, object]]:
    """The verdicts as ``llmfleet plan --json`` carries them: the verdict, its reasons and every figure."""
    return [
        {
            "pool": pool.name,
            "threshold_tokens": at,
            "disaggregated_in_stack": pool.disaggregation is not None,
            "pays": found.pays,
            "reasons": list(found.reasons),
            "stack_bounds": list(bounds),
            "sizing": {**asdict(sizing), "split": sizing.prefill + sizing.decode, "notes": list(sizing.notes)},
        }
        for pool, at, sizing, found, bounds in pool_pd(spec, threshold)
    ]
