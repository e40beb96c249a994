"""P/D compare: one trace through an aggregated pool and through disaggregated pools of as many replicas (equal paid
GPU-hours), each at a decision threshold, with TTFT and inter-token latency both in the SLO.

``llmfleet simulate --compare pd`` (`simulate.cli`). For each total size ``N`` (the plan's count for the trace, or
each of ``--fixed``) the rows are ``aggregated N`` and, per ``--pd-threshold``, ``P prefill + D decode`` with
``P + D = N``: `fleet.capacity.disagg_split.split_roles` of the counts `fleet.capacity.disagg_plan.size_roles` gives
for the trace's traffic at its peak (prefill replicas from the TTFT target, decode replicas from the inter-token
target), in their proportion, within the pool's ``disaggregation.prefill.replicas`` where the stack sets it, at least
one of each. The split is chosen once per trace and threshold: no scaler moves the roles during the replay. The
router is the stack's own over the decode replicas (`simulate.pd_sim`). The SLO is the pool's: TTFT p99 and
``decodeTokensPerSP99`` as an inter-token target of ``1 / decodeTokensPerSP99`` seconds; a request is *good* when
its TTFT and its mean time per output token (TPOT) both meet them (DistServe's goodput; rejections count as misses).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from fleet.capacity.disagg import KvLink
from fleet.capacity.disagg_plan import Mix, RoleSizing, size_roles
from fleet.capacity.disagg_split import SplitContext, prefill_bounds, split_roles
from fleet.capacity.perf import kv_bytes_per_token
from fleet.capacity.plan import model_facts, step_model
from simulate.configs import make_router
from simulate.pd_sim import PdResult, PdSim
from simulate.replay import Prepared, _spec
from simulate.report import Row
from simulate.result import quantile

DRAW = 0.01  # good shares this close are a draw: a seed moves them as much

__all__ = [
    "PdConfig",
    "pd_configs",
    "pd_report",
    "pd_row",
    "pd_table",
    "run_pd",
    "run_pd_all",
    "sizing",
    "trace_mix",
]


@dataclass(frozen=True)
class PdConfig:
    routing: str
    decode: int
    prefill: int = 0  # 0: the aggregated pool
    threshold: int = 0

    @property
    def name(self) -> str:
        if not self.prefill:
            return f"aggregated {self.decode}"
        return f"{self.prefill}P+{self.decode}D >{self.threshold}"


def trace_mix(prepared: Prepared, threshold: int) -> Mix:
    """The trace's traffic split by ``threshold``; each prompt's uncached part is its tokens less the trace's
    infinite-cache hit rate (the decision itself, in the replay, reads the decode replica's real cache)."""
    work = prepared.pool.workload
    keep = 1.0 - work.cached_prompt_fraction
    uncached = [r.prompt_tokens * keep for r in prepared.trace]
    remote = [u for u in uncached if u > threshold]
    local = [u for u in uncached if u <= threshold]
    n = max(1, len(uncached))
    return Mix(
        peak_qps=work.peak_qps,
        prompt_tokens=work.mean_prompt_tokens,
        output_tokens=work.mean_output_tokens,
        remote_share=len(remote) / n,
        remote_uncached=sum(remote) / len(remote) if remote else 0.0,
        local_uncached=sum(local) / len(local) if local else 0.0,
        buffer=work.capacity_buffer,
    )


def sizing(prepared: Prepared, threshold: int, link: KvLink) -> RoleSizing:
    """Both roles sized for the trace at ``threshold`` (`fleet.capacity.disagg_plan.size_roles`)."""
    spec, pool = _spec(prepared.stack), prepared.pool
    return size_roles(
        step_model(spec, pool),
        trace_mix(prepared, threshold),
        pool.slo.ttft_p99_ms / 1000.0,
        1.0 / pool.slo.decode_tokens_per_s_p99,
        link,
        kv_bytes_per_token(model_facts(pool)),
        pool.engine.max_num_batched_tokens,
        max(1, prepared.plan.concurrency_per_replica),
    )


def pd_configs(
    routing: str,
    sizes: Sequence[int],
    splits: Sequence[tuple[int, RoleSizing]],
    bounds: tuple[int, int | None] = (1, None),
) -> list[PdConfig]:
    """Per total size: the aggregated pool, then each threshold's split of that many replicas (`split_roles`, the
    prefill role within ``bounds``: at least one of each role)."""
    out = []
    for n in sizes:
        out.append(PdConfig(routing, n))
        for threshold, s in splits:
            ctx = SplitContext(s.prefill, s.decode, n, max(1, bounds[0]), bounds[1])
            split = split_roles(ctx)
            out.append(PdConfig(routing, split.decode, split.prefill, threshold))
    return out


def run_pd(prepared: Prepared, config: PdConfig, seed: int, link: KvLink) -> PdResult:
    """Replay the trace through ``config``'s pool (fixed sizes, no scaler)."""
    spec = _spec(prepared.stack)
    sim = PdSim(
        spec,
        prepared.pool,
        make_router(spec, config.routing, seed),
        prepared.trace,
        decode=config.decode,
        prefill=config.prefill,
        threshold=config.threshold,
        link=link,
        name=config.name,
        floor_rids=prepared.floor_rids,
    )
    result = sim.run()
    assert isinstance(result, PdResult)
    return result


def run_pd_all(
    prepared: Prepared, configs: Sequence[PdConfig], seed: int, link: KvLink, jobs: int = 1
) -> list[PdResult]:
    """`run_pd` for each of ``configs``, in order, ``jobs`` processes at a time (1: in this one)."""
    jobs = max(1, min(jobs, len(configs)))
    if jobs == 1:
        return [run_pd(prepared, c, seed, link) for c in configs]
    n = len(configs)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_pd, [prepared] * n, configs, [seed] * n, [link] * n))


def pd_row(result: PdResult, prepared: Prepared) -> Row:
    """One configuration's figures (seconds, shares in [0, 1])."""
    slo = prepared.pool.slo
    ttft_s, itl_s = slo.ttft_p99_ms / 1000.0, 1.0 / slo.decode_tokens_per_s_p99
    itls = sorted(result.itls)
    ttfts = sorted(t for t, _ in result.per_request)
    tpots = sorted(p for _, p in result.per_request)
    good = sum(1 for t, p in result.per_request if t <= ttft_s and p <= itl_s)
    n = max(1, result.requests)
    moved = sorted(result.transfer_s)
    return {
        "configuration": result.name,
        "paid_gpu_h": result.paid_gpu_s / 3600.0,
        "busy": result.busy_s / result.replica_s if result.replica_s else 0.0,
        "ttft_p50": quantile(ttfts, 0.5),
        "ttft_p99": quantile(ttfts, 0.99),
        "itl_p50": quantile(itls, 0.5),
        "itl_p99": quantile(itls, 0.99),
        "tpot_p99": quantile(tpots, 0.99),
        "ttft_in_slo": sum(1 for t in ttfts if t <= ttft_s) / n,
        "itl_in_slo": sum(1 for p in tpots if p <= itl_s) / n,
        "good": good / n,
        "remote": result.disaggregated / n,
        "transfer_p99": quantile(moved, 0.99),
        "handshakes": result.handshakes,
        "recomputed": result.recomputed,
        "rejected": result.rejected + result.unrouted,
    }


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v * 1000:.0f}ms"


def pd_table(rows: Sequence[Row]) -> str:
    """One line per configuration."""
    width = max(14, *(len(str(r["configuration"])) for r in rows))
    lines = [
        f"{'pool':<{width}} {'GPU-h':>6} {'busy':>5} {'TTFT p50':>8} {'p99':>7} {'ITL p50':>7} {'p99':>6} "
        f"{'TPOT p99':>8} {'TTFT ok':>7} {'TPOT ok':>7} {'good':>7} {'remote':>6} {'xfer p99':>8} {'hshk':>4} "
        f"{'recomp':>6} {'reject':>6}"
    ]
    for r in rows:
        f = {k: float(v) for k, v in r.items() if k != "configuration"}
        lines.append(
            f"{r['configuration']!s:<{width}} {f['paid_gpu_h']:>6.2f} {f['busy']:>5.0%} {_ms(f['ttft_p50']):>8} "
            f"{_ms(f['ttft_p99']):>7} {_ms(f['itl_p50']):>7} {_ms(f['itl_p99']):>6} {_ms(f['tpot_p99']):>8} "
            f"{f['ttft_in_slo']:>7.1%} {f['itl_in_slo']:>7.1%} {f['good']:>7.1%} {f['remote']:>6.0%} "
            f"{_ms(f['transfer_p99']):>8} {int(f['handshakes']):>4} {int(f['recomputed']):>6} {int(f['rejected']):>6}"
        )
    return "\n".join(lines)


def pd_report(
    prepared: Prepared,
    routing: str,
    sizes: Sequence[int],
    thresholds: Sequence[int],
    link: KvLink,
    seed: int,
    jobs: int,
) -> str:
    """What ``--compare pd`` prints: the link, each threshold's sizing, the table, and per size which pool served
    more requests within both targets."""
    slo = prepared.pool.slo
    lines = [
        f"pd: KV {kv_bytes_per_token(model_facts(prepared.pool)):,} B/token over {link.gbps:g} Gbit/s per prefill "
        f"replica, {link.handshake_s:g}s handshake per new prefill/decode pair; targets TTFT {slo.ttft_p99_ms:g}ms, "
        f"inter-token {1000.0 / slo.decode_tokens_per_s_p99:.1f}ms (1 / decodeTokensPerSP99)"
    ]
    splits = []
    for threshold in thresholds:
        s = sizing(prepared, threshold, link)
        mix = trace_mix(prepared, threshold)
        splits.append((threshold, s))
        lines.append(
            f"  threshold {threshold}: {mix.remote_share:.0%} of requests prefill remotely (mean uncached "
            f"{mix.remote_uncached:.0f} tokens); sized for the peak: {s.prefill} prefill (TTFT) + {s.decode} decode "
            f"(inter-token) against {s.aggregated} aggregated" + "".join(f"; {n}" for n in s.notes)
        )
    bounds = prefill_bounds(prepared.pool)
    if prepared.pool.disaggregation is not None:
        lines.append(
            f"  the stack's pools[].disaggregation: prefill.replicas {bounds[0]}..{bounds[1]} bound each split; "
            f"thresholdTokens {prepared.pool.disaggregation.threshold_tokens}"
        )
    configs = pd_configs(routing, sizes, splits, bounds)
    rows = [pd_row(r, prepared) for r in run_pd_all(prepared, configs, seed, link, jobs)]
    lines.append(pd_table(rows))
    lines.append(
        "GPU-h: paid; TTFT as the client sees it (gateway queue, prefill leg, KV transfer); ITL: every inter-token "
        "gap; TPOT: a request's mean gap; TTFT ok / TPOT ok / good: shares of all requests meeting the TTFT target, "
        "the inter-token target, both; remote: prefilled on a prefill replica; xfer: handshake + link queue + wire"
    )
    lines += _verdicts(rows, configs, sizes)
    return "\n".join(lines)


def _verdicts(rows: Sequence[Row], configs: Sequence[PdConfig], sizes: Sequence[int]) -> list[str]:
    """Per total size, which pool served more requests within both targets, by how much, and the tails behind it."""
    lines: list[str] = []
    for n in sizes:
        group = [r for r, c in zip(rows, configs, strict=True) if c.prefill + c.decode == n]
        base, best = group[0], max(group[1:], key=lambda r: float(r["good"]), default=None)
        if best is None:
            continue
        gain = float(best["good"]) - float(base["good"])
        word = "pays" if gain > DRAW else "does not pay" if gain < -DRAW else "is a draw (within a point)"
        paid, base_paid = float(best["paid_gpu_h"]), float(base["paid_gpu_h"])
        longer = (
            f"; its backlog ran past the trace: {paid:.2f} GPU-h against {base_paid:.2f}"
            if paid > base_paid * 1.01
            else ""
        )
        lines.append(
            f"at {n} replicas disaggregation {word}: best split {best['configuration']} {float(best['good']):.1%} "
            f"good against aggregated {float(base['good']):.1%} (ITL p99 {_ms(float(best['itl_p99']))} against "
            f"{_ms(float(base['itl_p99']))}, TTFT p99 {_ms(float(best['ttft_p99']))} against "
            f"{_ms(float(base['ttft_p99']))}{longer})"
        )
    return lines
