"""Surfaces other than a request's answer, reduced to comparable JSON: ``/metrics`` families, KV-event frames.

Both become an `Exchange` under a probe name of their own, so `tests.differential.compare` compares them as it
compares answers: metrics by family name, type and label names (values depend on timings); a KV-event frame by
topic, sequence number, batch shape and every event field (hashes and token ids exactly: the same tokens under
the same hash seed must give the same hashes).
"""

from __future__ import annotations

import re
from typing import Any

import msgpack
from prometheus_client.parser import text_string_to_metric_families

from tests.differential.exchange import Exchange

__all__ = ["kv_frame", "metric_families"]

_LE = re.compile(r"^le$|^quantile$")
# Labels whose values name states or settings that must match (the rest of cache_config_info's are sizes).
_ENUMERATED = {
    "vllm:cache_config_info": {"block_size", "enable_prefix_caching", "cache_dtype", "prefix_caching_hash_algo"},
    "vllm:engine_sleep_state": {"sleep_state"},
    "vllm:request_success": {"finished_reason"},
}


def metric_families(text: str, prefix: str = "vllm:") -> dict[str, Any]:
    """``{family: {"type": ..., "labels": [names], "values": {label value sets}}}`` for families under
    ``prefix``; a family's label *values* are kept only for its enumerating labels (`_ENUMERATED`), which name
    states or settings rather than sizes."""
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix):
            continue
        labels: set[str] = set()
        for sample in family.samples:
            labels |= {k for k in sample.labels if not _LE.match(k)}
        entry: dict[str, Any] = {"type": family.type, "labels": sorted(labels - {"model_name", "engine"})}
        if family.name in _ENUMERATED:
            keep = _ENUMERATED[family.name]
            entry["label values"] = sorted(
                {f"{k}={v}" for s in family.samples for k, v in s.labels.items() if k in keep}
            )
        out[family.name] = entry
    return out


def metrics_exchange(text: str) -> Exchange:
    return Exchange("metrics", 200, "text/plain", "json", metric_families(text))


def kv_frame(frames: list[bytes]) -> dict[str, Any]:
    """One batch as the replay socket returns it, ``[topic, seq, payload]`` (the published frames): the topic, the
    sequence number (8 bytes big-endian) and the msgpack batch ``[ts, events, dp_rank]``, each event a map (or
    vLLM's tagged array) turned into a map."""
    topic, seq, payload = frames
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    ts, events, *rest = batch
    return {
        "frames": len(frames),
        "topic": topic.decode(),
        "seq bytes": len(seq),
        "seq": int.from_bytes(seq, "big"),
        "batch length": len(batch),
        "ts": ts,
        "dp_rank": rest[0] if rest else None,
        "events": [_event(e) for e in events],
    }


def _event(event: Any) -> Any:
    if isinstance(event, dict):
        return {k: (v.hex() if isinstance(v, bytes) else v) for k, v in event.items()}
    return {"array": [v.hex() if isinstance(v, bytes) else v for v in event]}
