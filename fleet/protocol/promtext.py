"""Promtext: a pure parser of the Prometheus text exposition format and the engine load derived from it.

Used by the agent (load reports), the gateway (endpoint scraping) and tests. No I/O: callers fetch
``/metrics`` themselves and pass the text in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "EngineMetrics",
    "Sample",
    "counter_value",
    "lora_active",
    "gauge_value",
    "histogram_buckets",
    "diff_buckets",
    "engine_asleep",
    "histogram_quantile",
    "parse",
]

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str) -> dict[str, list[Sample]]:
    """Samples by exposed name (``vllm:prompt_tokens_total``, ``..._bucket``); comments are skipped.

    Raises ValueError naming the line for a malformed sample, so a broken scrape is never read as zero.
    """
    out: dict[str, list[Sample]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"line {number}: not a Prometheus sample: {line[:80]!r}")
        labels = {k: _unescape(v) for k, v in _LABEL.findall(match.group("labels") or "")}
        value = _float(match.group("value"), number)
        out.setdefault(match.group("name"), []).append(Sample(match.group("name"), labels, value))
    return out


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def _float(text: str, number: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"line {number}: bad sample value {text!r}") from None


def _matches(sample: Sample, labels: Mapping[str, str] | None) -> bool:
    return not labels or all(sample.labels.get(k) == v for k, v in labels.items())


def gauge_value(samples: Mapping[str, list[Sample]], name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of the matching samples of gauge ``name``; KeyError when the metric is absent."""
    if name not in samples:
        raise KeyError(name)
    return sum(s.value for s in samples[name] if _matches(s, labels))


def counter_value(samples: Mapping[str, list[Sample]], name: str, labels: Mapping[str, str] | None = None) -> float:
    """Counter ``name`` (with or without the ``_total`` suffix) summed over matching samples."""
    key = name if name.endswith("_total") else f"{name}_total"
    return gauge_value(samples, key, labels)


def histogram_buckets(
    samples: Mapping[str, list[Sample]], name: str, labels: Mapping[str, str] | None = None
) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) pairs of histogram ``name``, summed over label sets, sorted by bound."""
    totals: dict[float, float] = {}
    for sample in samples.get(f"{name}_bucket", []):
        if _matches(sample, labels):
            bound = float(sample.labels["le"])
            totals[bound] = totals.get(bound, 0.0) + sample.value
    return sorted(totals.items())


def histogram_quantile(buckets: Iterable[tuple[float, float]], q: float) -> float | None:
    """Prometheus-style quantile from cumulative buckets (linear within a bucket); None when empty."""
    pairs = sorted(buckets)
    if not pairs or pairs[-1][1] <= 0:
        return None
    total = pairs[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in pairs:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            width = count - prev_count
            frac = 0.0 if width <= 0 else (rank - prev_count) / width
            return prev_bound + (bound - prev_bound) * frac
        prev_bound, prev_count = bound, count
    return prev_bound


def diff_buckets(now: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Buckets of the observations made between two scrapes (for a recent, not lifetime, quantile)."""
    old = dict(before)
    return [(bound, max(0.0, count - old.get(bound, 0.0))) for bound, count in now]


@dataclass(frozen=True)
class EngineMetrics:
    """The load-relevant numbers of one vLLM (or simulator) ``/metrics`` scrape."""

    running: float
    waiting: float
    kv_usage: float
    preemptions: float
    prompt_tokens: float
    generation_tokens: float
    prefix_queries: float
    prefix_hits: float
    ttft_buckets: list[tuple[float, float]]
    lora_active: frozenset[str] = frozenset()  # adapters of running or waiting requests (only with LoRA)

    @classmethod
    def from_text(cls, text: str) -> EngineMetrics:
        """Parse a scrape; KeyError when a required vLLM metric is missing (never defaulted to zero)."""
        return cls.from_samples(parse(text))

    @classmethod
    def from_samples(cls, samples: Mapping[str, list[Sample]]) -> EngineMetrics:
        """`from_text` on an already parsed scrape."""
        return cls(
            running=gauge_value(samples, "vllm:num_requests_running"),
            waiting=gauge_value(samples, "vllm:num_requests_waiting"),
            kv_usage=gauge_value(samples, "vllm:kv_cache_usage_perc"),
            preemptions=counter_value(samples, "vllm:num_preemptions"),
            prompt_tokens=counter_value(samples, "vllm:prompt_tokens"),
            generation_tokens=counter_value(samples, "vllm:generation_tokens"),
            prefix_queries=_optional_counter(samples, "vllm:prefix_cache_queries"),
            prefix_hits=_optional_counter(samples, "vllm:prefix_cache_hits"),
            ttft_buckets=histogram_buckets(samples, "vllm:time_to_first_token_seconds"),
            lora_active=lora_active(samples),
        )


def engine_asleep(samples: Mapping[str, list[Sample]]) -> bool:
    """Whether ``vllm:engine_sleep_state`` says the engine sleeps: its ``sleep_state="awake"`` series is 0. An
    engine without sleep mode exports no such series and is awake."""
    awake = [s.value for s in samples.get("vllm:engine_sleep_state", ()) if s.labels.get("sleep_state") == "awake"]
    return bool(awake) and all(value == 0.0 for value in awake)


def _optional_counter(samples: Mapping[str, list[Sample]], name: str) -> float:
    try:
        return counter_value(samples, name)
    except KeyError:
        return 0.0


def lora_active(samples: Mapping[str, list[Sample]]) -> frozenset[str]:
    """The adapters ``vllm:lora_requests_info`` names as running or waiting, from its newest series (vLLM adds a
    series per label set, valued with the time it was set); empty without LoRA."""
    series = samples.get("vllm:lora_requests_info")
    if not series:
        return frozenset()
    newest = max(series, key=lambda sample: sample.value)
    names = (newest.labels.get("running_lora_adapters", ""), newest.labels.get("waiting_lora_adapters", ""))
    return frozenset(name for value in names for name in value.split(",") if name)
