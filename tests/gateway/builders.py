"""Builders for gateway tests: endpoint snapshots and request infos; and a gateway's counter as it exports it."""

from __future__ import annotations

from typing import Any

from fleet.protocol import promtext
from gateway.routing.base import EndpointView, RequestInfo
from gateway.service import Gateway
from tests.support.stacks import MODEL

# Session affinity under p2c, as docs/gateway.md shows it (the prod stack's routing before it moved to kv-cache
# under least-work): a session stays on its replica while p2c's load bound allows.
P2C_SESSION_ROUTING: dict[str, Any] = {
    "filters": [{"name": "ready"}, {"name": "serves-model"}],
    "scorers": [
        {"name": "queue-depth", "weight": 2},
        {"name": "kv-usage", "weight": 1},
        {"name": "prefix-affinity", "weight": 1},
        {"name": "session-affinity", "weight": 5},
    ],
    "picker": {"name": "p2c"},
}


def endpoint(rid: str = "a", **overrides: Any) -> EndpointView:
    values: dict[str, Any] = {
        "id": rid,
        "url": f"http://{rid}",
        "pool": "qwen-7b",
        "model": MODEL,
        "ready": True,
        "ejected": False,
        "metrics_age_s": 0.1,
        "running": 0.0,
        "waiting": 0.0,
        "kv_usage": 0.0,
        "in_flight": 0,
        "max_num_seqs": 8,
    }
    values.update(overrides)
    return EndpointView(**values)


def request(**overrides: Any) -> RequestInfo:
    values: dict[str, Any] = {
        "request_id": "r1",
        "model": MODEL,
        "tenant": "gold",
        "priority": 5,
        "prompt": "",
        "session_id": None,
        "now": 0.0,
    }
    values.update(overrides)
    return RequestInfo(**values)


class ManualClock:
    """A `fleet.protocol.clock.Clock` that moves only when a test sets ``now`` (or something sleeps on it)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def counted(gateway: Gateway, name: str, labels: dict[str, str]) -> float:
    """The gateway's counter ``name`` for ``labels`` in its /metrics text; 0 when it has no such series."""
    samples = promtext.parse(gateway.metrics.render().decode())
    try:
        return promtext.counter_value(samples, name, labels)
    except KeyError:
        return 0.0
