"""Scenarios: synthetic gateway and engine series for one pool, and which alerts fire when, as promtool tests.

Every scenario feeds all the series the pool's rules read, one sample a minute from minute 0 (counters start
at 0, so ``rate()`` over any window is the exact share of increments in it): 1,000 requests and 1,000 output
tokens a minute, 10 of the requests a 429 (client errors are not unavailability), and a second model's requests
all failing (the pool's rules must select by model). Each SLI's bad share follows a burn: a multiple of the SLI's
budget per minute (availability: 0.1% for 99.9%; TTFT and decode speed: 1%, P99 targets).

The scenarios, with the alerts that fire at each checked minute (every other alert of the pool must be quiet):

* ``<sli>-burst``: healthy, then 50x the budget from minute 30 to 50, healthy again. At 47 the fast burn
  pages (1h and 5m both above 14.4x) and the warning is on; at 58 the burst has left the 5m window, so the fast
  burn is quiet and the slow burn (6h and 30m above 6x since minute 35, for 15m) pages; at 85 only the warning
  (1h) remains.
* ``<sli>-slow-burn``: 8x the budget throughout: at 30 the slow burn pages and the fast one does not.
* ``<sli>-below-page``: 2x the budget throughout: at 30 only the warning (half the budget over 1h).
* ``healthy``: nothing fires; ``preempting``: one preemption a minute, at 30 only the preemption alert.
* For a pool with ``engine.kvEvents``, every scenario also feeds the gateway's KV series (two event streams up,
  the tokenizer available), and two more scenarios break them: ``kv-stream-down`` (one stream down from minute
  10: quiet at 15, pending for 10m; ``LlmfleetKvEventStreamsDown`` at 30) and ``kv-no-tokenizer``
  (``LlmfleetKvTokenizerMissing`` at 30).

``LlmfleetErrorRateAboveSlo`` reads the availability SLI over 30m against ``errorRate``: it fires in the
availability burst (at 47 and 58) and slow burn, not in the 2x scenario; that needs 2x < errorRate / budget < 8x
(5x for the defaults), which `pool_tests` checks.

Recording rules are checked in each SLI's burst at minutes 47 and 58, where the four windows differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.slo.rules import (
    ENGINE_ITL,
    GATEWAY_TTFT,
    KV_STREAMS,
    KV_TOKENIZER,
    PREEMPTIONS,
    PROM_POOL_LABEL,
    REQUESTS,
    VLLM_ITL_BUCKETS,
    WINDOWS,
    Sli,
    edge_at_or_below,
    le_label,
    pool_slis,
)
from fleet.spec.stack import PoolSpec

__all__ = ["MINUTES", "SCENARIOS", "Scenario", "counter_values", "pool_tests"]

MINUTES = 90  # samples at minutes 0..90
PER_MINUTE = 1000.0  # requests, and output tokens, a minute
CLIENT_ERRORS = 10.0  # 429s a minute
_WINDOW_MINUTES = {"5m": 5, "30m": 30, "1h": 60, "6h": 360}
_FAST, _SLOW, _NEAR = "BudgetBurnFast", "BudgetBurnSlow", "NearSlo"
ERROR_RATE, PREEMPTION = "LlmfleetErrorRateAboveSlo", "LlmfleetPreemptions"
KV_DOWN, KV_NO_TOKENIZER = "LlmfleetKvEventStreamsDown", "LlmfleetKvTokenizerMissing"
SLIS = ("availability", "ttft", "decode")  # the order of `fleet.slo.rules.pool_slis`


@dataclass(frozen=True)
class Burn:
    """The bad share, as a multiple of the budget, of the minute ending at each sample: (from, to, multiple)."""

    segments: tuple[tuple[int, int, float], ...] = ()

    def multiple(self, minute: int) -> float:
        return next((m for start, end, m in self.segments if start < minute <= end), 0.0)

    def window_share(self, minute: int, window: int) -> float:
        """The mean multiple over the ``window`` minutes up to ``minute`` (only those since minute 0)."""
        minutes = range(max(0, minute - window) + 1, minute + 1)
        return sum(self.multiple(m) for m in minutes) / len(minutes)


@dataclass(frozen=True)
class Scenario:
    name: str
    burning: str | None = None  # the SLI that burns, one of SLIS
    burn: Burn = Burn()
    preempting: bool = False
    kv: str | None = None  # a KV routing fault: "stream-down" or "no-tokenizer" (pools with engine.kvEvents only)
    # minute -> what fires: "fast", "slow", "near" of the burning SLI, "error_rate", "preemptions"
    fires: Mapping[int, frozenset[str]] = field(default_factory=dict)
    records_at: tuple[int, ...] = ()  # minutes at which the burning SLI's recording rules are checked


def _scenarios() -> list[Scenario]:
    out = [
        Scenario("healthy", fires={30: frozenset()}),
        Scenario("preempting", preempting=True, fires={30: frozenset({"preemptions"})}),
        Scenario("kv-stream-down", kv="stream-down", fires={15: frozenset(), 30: frozenset({"kv_down"})}),
        Scenario("kv-no-tokenizer", kv="no-tokenizer", fires={30: frozenset({"kv_no_tokenizer"})}),
    ]
    for sli in SLIS:
        errors = {"error_rate"} if sli == "availability" else set()
        out += [
            Scenario(
                f"{sli}-burst",
                sli,
                Burn(((30, 50, 50.0),)),
                fires={
                    47: frozenset({"fast", "near", *errors}),
                    58: frozenset({"slow", "near", *errors}),
                    85: frozenset({"near"}),
                },
                records_at=(47, 58),
            ),
            Scenario(
                f"{sli}-slow-burn", sli, Burn(((0, MINUTES, 8.0),)), fires={30: frozenset({"slow", "near", *errors})}
            ),
            Scenario(f"{sli}-below-page", sli, Burn(((0, MINUTES, 2.0),)), fires={30: frozenset({"near"})}),
        ]
    return out


SCENARIOS = _scenarios()


def counter_values(increments: Sequence[float]) -> str:
    """Promtool's expanding notation for a counter at 0 that grows by ``increments[i]`` in minute i + 1.

    ``[10, 10, 10, 5]`` -> ``'0+10x3 35+5x0'``: runs of equal growth become ``start+step x n``.
    """
    parts: list[str] = []
    value, i = 0.0, 0
    while i < len(increments):
        step, run = increments[i], 1
        while i + run < len(increments) and increments[i + run] == step:
            run += 1
        if not parts:
            parts.append(f"0+{step:.12g}x{run}")
        else:
            parts.append(f"{value + step:.12g}+{step:.12g}x{run - 1}")
        value += step * run
        i += run
    return " ".join(parts)


def _series(name: str, labels: Mapping[str, str], increments: Sequence[float]) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{text}}}", "values": counter_values(increments)}


def _input_series(pool: PoolSpec, scenario: Scenario, slis: Mapping[str, Sli]) -> list[dict[str, str]]:
    minutes = range(1, MINUTES + 1)

    def bad(sli: str) -> list[float]:
        burn = scenario.burn if scenario.burning == sli else Burn()
        return [PER_MINUTE * burn.multiple(m) * slis[sli].budget for m in minutes]

    def good(sli: str, spared: float = 0.0) -> list[float]:
        return [PER_MINUTE - spared - b for b in bad(sli)]

    every = [PER_MINUTE for _ in minutes]
    model = {"tenant": "t", "model": pool.served_name}
    other = {"tenant": "t", "model": f"not-{pool.served_name}"}  # another pool's model, always failing
    engine = {"model_name": pool.served_name, "engine": "0", PROM_POOL_LABEL: pool.name}
    ttft_le = le_label(pool.slo.ttft_p99_ms / 1000.0)
    itl_le = le_label(edge_at_or_below(VLLM_ITL_BUCKETS, 1.0 / pool.slo.decode_tokens_per_s_p99))
    return [
        _series(REQUESTS, {**model, "status": "200"}, good("availability", CLIENT_ERRORS)),
        _series(REQUESTS, {**model, "status": "429"}, [CLIENT_ERRORS for _ in minutes]),
        _series(REQUESTS, {**model, "status": "503"}, bad("availability")),
        _series(REQUESTS, {**other, "status": "200"}, [0.0 for _ in minutes]),
        _series(REQUESTS, {**other, "status": "500"}, every),
        _series(f"{GATEWAY_TTFT}_bucket", {**model, "le": ttft_le}, good("ttft")),
        _series(f"{GATEWAY_TTFT}_bucket", {**model, "le": "+Inf"}, every),
        _series(f"{GATEWAY_TTFT}_count", model, every),
        _series(f"{ENGINE_ITL}_bucket", {**engine, "le": itl_le}, good("decode")),
        _series(f"{ENGINE_ITL}_bucket", {**engine, "le": "+Inf"}, every),
        _series(f"{ENGINE_ITL}_count", engine, every),
        _series(PREEMPTIONS, engine, [1.0 if scenario.preempting else 0.0 for _ in minutes]),
        *(_kv_series(pool, scenario) if pool.engine.kv_events else []),
    ]


def _kv_series(pool: PoolSpec, scenario: Scenario) -> list[dict[str, str]]:
    """The gateway's KV gauges (minutes 0..MINUTES): two streams, one of them down from minute 10 in
    ``stream-down``; the tokenizer available, but not in ``no-tokenizer``."""
    down = f"0+0x9 1+0x{MINUTES - 10}" if scenario.kv == "stream-down" else f"0+0x{MINUTES}"
    up = f"2+0x9 1+0x{MINUTES - 10}" if scenario.kv == "stream-down" else f"2+0x{MINUTES}"
    available = f"0+0x{MINUTES}" if scenario.kv == "no-tokenizer" else f"1+0x{MINUTES}"
    labels = f'pool="{pool.name}"'
    return [
        {"series": f'{KV_STREAMS}{{{labels},state="up"}}', "values": up},
        {"series": f'{KV_STREAMS}{{{labels},state="down"}}', "values": down},
        {"series": f"{KV_TOKENIZER}{{{labels}}}", "values": available},
    ]


def _firing(scenario: Scenario, slis: Mapping[str, Sli], what: frozenset[str]) -> set[str]:
    names = {"error_rate": ERROR_RATE, "preemptions": PREEMPTION}
    names |= {"kv_down": KV_DOWN, "kv_no_tokenizer": KV_NO_TOKENIZER}
    suffixes = {"fast": _FAST, "slow": _SLOW, "near": _NEAR}
    out = {names[w] for w in what if w in names}
    if scenario.burning is not None:
        out |= {slis[scenario.burning].alert + suffixes[w] for w in what if w in suffixes}
    return out


def _alert_tests(scenario: Scenario, slis: Mapping[str, Sli], alerts: Sequence[dict[str, Any]]) -> list[Any]:
    tests = []
    for minute, what in sorted(scenario.fires.items()):
        firing = _firing(scenario, slis, what)
        unknown = firing - {a["alert"] for a in alerts}
        assert not unknown, f"scenario {scenario.name} expects alerts the rules lack: {sorted(unknown)}"
        for alert in alerts:
            expected = (
                [{"exp_labels": dict(alert["labels"]), "exp_annotations": dict(alert["annotations"])}]
                if alert["alert"] in firing
                else []
            )
            tests.append({"eval_time": f"{minute}m", "alertname": alert["alert"], "exp_alerts": expected})
    return tests


def _record_tests(pool: PoolSpec, scenario: Scenario, slis: Mapping[str, Sli]) -> list[dict[str, Any]]:
    if scenario.burning is None:
        return []
    sli = slis[scenario.burning]
    # round(): promtool compares floats exactly, and a ratio of rates is off in the last bit.
    return [
        {
            "expr": f"round({sli.recorded(window)}, 1e-6)",
            "eval_time": f"{minute}m",
            "exp_samples": [
                {
                    "labels": f'{{pool="{pool.name}"}}',
                    "value": round(scenario.burn.window_share(minute, _WINDOW_MINUTES[window]) * sli.budget, 6),
                }
            ],
        }
        for minute in scenario.records_at
        for window in WINDOWS
    ]


def pool_tests(
    pool: PoolSpec, groups: Sequence[Mapping[str, Any]], only: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Promtool ``tests:`` entries for ``pool``, whose rules are ``groups`` (`fleet.slo.rules.pool_rule_groups`):
    one per scenario, or per scenario named in ``only``."""
    slis = dict(zip(SLIS, pool_slis(pool), strict=True))
    budget = slis["availability"].budget
    if not 2.2 * budget < pool.slo.error_rate < 7.3 * budget:
        raise ValueError(
            f"pool {pool.name}: the scenarios need errorRate between 2.2x and 7.3x the unavailability budget "
            f"({budget:g}), not {pool.slo.error_rate:g}"
        )
    alerts = [rule for group in groups for rule in group["rules"] if "alert" in rule]
    return [
        {
            "name": f"{pool.name}: {scenario.name}",
            "interval": "1m",
            "input_series": _input_series(pool, scenario, slis),
            "alert_rule_test": _alert_tests(scenario, slis, alerts),
            "promql_expr_test": _record_tests(pool, scenario, slis),
        }
        for scenario in SCENARIOS
        if (only is None or scenario.name in only) and (scenario.kv is None or pool.engine.kv_events)
    ]
