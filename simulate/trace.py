"""Traces: request arrivals with token counts (and, when the trace has them, prefix-block ids) read from a file.

Formats, told apart by the file's name and first record:

* **Azure LLM inference trace 2023** (``.csv``): header ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps
  are wall-clock (``2023-11-16 18:17:03.9799600``), replayed relative to the first one.
* **Mooncake** (``.jsonl`` whose records carry ``input_length``): ``timestamp`` in ms, ``input_length``,
  ``output_length``, ``hash_ids`` (ids of 512-token prefix blocks: equal leading ids = a reusable KV prefix).
* **llmfleet JSONL** (``.jsonl``, one object a line), the format to write your own traces in::

      {"t": 12.5, "prompt_tokens": 812, "output_tokens": 95}
      {"t": 12.9, "prompt_tokens": 2040, "output_tokens": 12, "prefix_blocks": [7, 8, 9]}

  ``t`` is seconds from the start (non-decreasing is not required: records are sorted), ``prompt_tokens`` >= 1,
  ``output_tokens`` >= 1, and ``prefix_blocks`` (optional) the ids of the prompt's 512-token blocks, as Mooncake's
  ``hash_ids``: two requests whose first k ids are equal share k x 512 tokens of prompt.

A malformed line raises `TraceError` naming the file and the line number. Empty lines are skipped.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "PREFIX_BLOCK_TOKENS",
    "TraceError",
    "TraceRequest",
    "read_trace",
    "scale_trace",
    "synthetic_trace",
]

PREFIX_BLOCK_TOKENS = 512  # tokens per Mooncake hash id
MAX_COPY_GAP_S = 10.0  # a rate-scaled copy lands at most this long after its original


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class TraceRequest:
    t: float  # arrival, seconds from the trace's start
    rid: str
    prompt_tokens: int
    output_tokens: int
    prefix_blocks: tuple[int, ...] = ()  # ids of 512-token prompt blocks; () = no prefix shared with anything
    tenant: str = ""  # who sent it (`simulate.tenants`); "" = the trace's one client
    cache_salt: str | None = None  # the salt its engine gets: its prefix cache is its tenant's (`simulate.tenants`)


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


def _blocks(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{key} must be a list of integers")
    return tuple(value)


def _read_azure(path: Path) -> Iterator[TraceRequest]:
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise TraceError(f"{path}:1: expected the header TIMESTAMP,ContextTokens,GeneratedTokens, got {header}")
        start: datetime | None = None
        for row in reader:
            line = reader.line_num
            if not row or not "".join(row).strip():
                continue
            try:
                if len(row) != 3:
                    raise ValueError(f"expected 3 columns, got {len(row)}")
                stamp = datetime.fromisoformat(row[0].strip()[:26])  # 7 decimals: keep microseconds
                start = start or stamp
                t = (stamp - start).total_seconds()
                prompt = _positive_int(int(row[1]), "ContextTokens")
                output = _positive_int(int(row[2]), "GeneratedTokens")
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {exc}") from None
            yield TraceRequest(t, f"{path.stem}-{line}", prompt, output)


def _json_record(record: Any) -> tuple[float, int, int, tuple[int, ...]]:
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    if "input_length" in record:  # Mooncake
        stamp = record.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or stamp < 0:
            raise ValueError(f"timestamp must be a non-negative number of ms, got {stamp!r}")
        blocks = _blocks(record.get("hash_ids", []), "hash_ids")
        prompt = _positive_int(record["input_length"], "input_length")
        return stamp / 1000.0, prompt, _positive_int(record.get("output_length"), "output_length"), blocks
    t = record.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise ValueError(f"t must be a non-negative number of seconds, got {t!r}")
    blocks = _blocks(record.get("prefix_blocks", []), "prefix_blocks")
    prompt = _positive_int(record.get("prompt_tokens"), "prompt_tokens")
    return float(t), prompt, _positive_int(record.get("output_tokens"), "output_tokens"), blocks


def _read_jsonl(path: Path) -> Iterator[TraceRequest]:
    with path.open() as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                t, prompt, output, blocks = _json_record(json.loads(text))
            except (ValueError, KeyError) as exc:  # json.JSONDecodeError is a ValueError
                raise TraceError(f"{path}:{number}: {exc}") from None
            yield TraceRequest(t, f"{path.stem}-{number}", prompt, output, blocks)


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Every request of the trace at ``path``, sorted by arrival, times relative to the first arrival."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    requests = list(_read_azure(p) if p.suffix.lower() == ".csv" else _read_jsonl(p))
    if not requests:
        raise TraceError(f"{p}: no requests")
    requests.sort(key=lambda r: r.t)
    first = requests[0].t
    return [replace(r, t=r.t - first) for r in requests] if first else requests


def scale_trace(
    trace: Sequence[TraceRequest], *, rate_scale: float = 1.0, time_scale: float = 1.0, seed: int = 0
) -> list[TraceRequest]:
    """The trace with ``time_scale`` x its timestamps (0.1 replays an hour in 6 minutes: the same requests at 10x
    the rate) and ``rate_scale`` x its requests per second with the same time shape: each request is replayed
    ``floor(rate_scale)`` times, plus once more with probability ``frac(rate_scale)`` (below 1: thinned), each copy
    at a uniformly drawn time between the original and the next arrival (at most ``MAX_COPY_GAP_S`` later), so
    copies fill the gaps instead of piling up as bursts the trace did not have (seeded)."""
    if rate_scale <= 0 or time_scale <= 0:
        raise ValueError("--rate-scale and --time-scale must be positive")
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    whole, frac = int(rate_scale), rate_scale - int(rate_scale)
    ordered = sorted(trace, key=lambda r: r.t)
    for j, r in enumerate(ordered):
        copies = whole + (1 if rng.random() < frac else 0)
        t = r.t * time_scale
        gap = min(MAX_COPY_GAP_S, (ordered[j + 1].t * time_scale - t) if j + 1 < len(ordered) else 0.0)
        for i in range(copies):
            at = t if i == 0 else t + rng.random() * gap
            out.append(replace(r, t=at, rid=r.rid if i == 0 else f"{r.rid}.{i}"))
    out.sort(key=lambda r: r.t)
    return out


def _day_shape(t: float) -> float:
    """Relative rate (peak 1.0) over a compressed day: quiet, ramp, plateau, drop, burst, quiet."""
    if t < 200:
        return 0.25
    if t < 600:
        return 0.25 + 0.75 * (t - 200) / 400
    if t < 900:
        return 1.0
    if t < 1100:
        return 0.3
    if t < 1200:
        return 0.8
    return 0.25


def synthetic_trace(
    peak_qps: float, seed: int, end_s: float = 1500.0, shape: Callable[[float], float] | None = None
) -> list[TraceRequest]:
    """A seeded Poisson trace at ``peak_qps x shape(t)`` (default shape: a compressed day, `_day_shape`; values in
    [0, 1]): ~200-token prompts opening with one of six shared 96-token system prompts (one 512-token prefix
    block id each, standing for the shared head) and ~80 output tokens; for benches and tests that need no file."""
    shape = shape or _day_shape
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    t, i = 0.0, 0
    while True:
        t += rng.expovariate(peak_qps)
        i += 1
        if t >= end_s:
            return out
        if rng.random() > shape(t):
            continue
        prompt = max(104, round(rng.gauss(200, 50)))
        output = max(4, round(rng.gauss(80, 25)))
        out.append(TraceRequest(t, f"req-{i}", prompt, output, (rng.randrange(6),)))
