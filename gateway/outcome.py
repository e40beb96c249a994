"""Outcome: what the gateway records about one answered request, and recording it (metrics, the control plane's
per-pool counts, the access log)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.metrics import AccessLog, GatewayMetrics
from gateway.reporting import PoolTraffic

__all__ = ["Outcome", "record"]


@dataclass
class Outcome:
    """What the access log and the metrics record about one request."""

    request_id: str
    received: float  # monotonic clock
    tenant: str = "-"
    model: str = "-"
    status: int = 0
    alias: str | None = None  # the alias the client named, when it named one
    adapter: str | None = None  # the LoRA adapter the client named, when it named one
    pool: str | None = None
    replica: str | None = None
    attempts: int = 0
    resumes: int = 0  # attempts to continue a broken stream (`gateway.streams`)
    stream: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    used_tokens: int = 0
    queued_s: float | None = None
    routed_s: float | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    upstream_s: float = 0.0
    error: str | None = None
    stream_status: int | None = None  # what a stream that failed after its 200 headers counts as (`gateway.streams`)


def record(
    out: Outcome, wall: float, m: GatewayMetrics, traffic: PoolTraffic | None, access_log: AccessLog | None
) -> None:
    """Count ``out`` (its ``done_s`` set) in ``m``, in its pool's ``traffic`` and in the access log (``wall``: the
    request's arrival, wall clock)."""
    assert out.done_s is not None
    m.child(m.requests, out.tenant, out.model, str(out.status)).inc()
    # A first token is timed only on a stream: a whole answer arrives at once, and its time is the e2e latency,
    # which would read as a slow first token in the TTFT SLI and in canary judgements.
    ttft = out.first_token_s if out.status == 200 and out.stream else None
    if traffic is not None:  # reported to the control plane, which judges canaries by it
        traffic.answered(out.status, ttft, _tpot(out))
    if out.status == 200:
        m.child(m.e2e, out.tenant, out.model).observe(out.done_s)
        if ttft is not None:
            m.child(m.ttft, out.tenant, out.model).observe(ttft)
        if out.prompt_tokens:
            m.child(m.tokens, out.tenant, out.model, "in").inc(out.prompt_tokens)
        if out.completion_tokens:
            m.child(m.tokens, out.tenant, out.model, "out").inc(out.completion_tokens)
    if out.attempts and not out.stream:
        m.child(m.overhead, out.model).observe(max(0.0, out.done_s - out.upstream_s - (out.queued_s or 0.0)))
    if access_log is not None:
        access_log.write(
            {
                "ts": round(wall, 6),
                "request_id": out.request_id,
                "tenant": out.tenant,
                "model": out.model,
                "alias": out.alias,
                "adapter": out.adapter,
                "pool": out.pool,
                "replica": out.replica,
                "status": out.status,
                "error": out.error,
                "stream": out.stream,
                "attempts": out.attempts,
                "resumes": out.resumes,
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                "queued_s": _r(out.queued_s),
                "routed_s": _r(out.routed_s),
                "first_token_s": _r(out.first_token_s),
                "done_s": _r(out.done_s),
            }
        )


def _tpot(out: Outcome) -> float | None:
    """Seconds per output token after the first, of a stream that succeeded with two tokens or more; None
    otherwise (a whole answer arrives at once: its tokens are not timed)."""
    tokens, first, done = out.completion_tokens, out.first_token_s, out.done_s
    if out.status != 200 or not out.stream or not tokens or tokens < 2 or first is None or done is None:
        return None
    return max(0.0, done - first) / (tokens - 1)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
