"""Builders of contexts, reports and specs for the autoscaler tests."""

from __future__ import annotations

import time
from typing import Any

from control_plane.scaling.context import ReplicaLoad, ScalingContext
from fleet.protocol.wire import GatewayReport, LoadReport
from fleet.spec.stack import AutoscalingSpec


def ready(name: str, waiting: float = 0, running: float = 0, kv: float = 0.0, ttft: float | None = 0.1) -> ReplicaLoad:
    return ReplicaLoad(name, "ready", waiting=waiting, running=running, kv_usage=kv, ttft_p99_s=ttft)


def stale(name: str) -> ReplicaLoad:
    return ReplicaLoad(name, "ready", stale=True, waiting=0, running=0, kv_usage=0.0, report_age_s=30)


def starting(name: str) -> ReplicaLoad:
    return ReplicaLoad(name, "starting")


def context(*replicas: ReplicaLoad, now: float = 1000.0, **overrides: Any) -> ScalingContext:
    fields: dict[str, Any] = {
        "pool": "qwen-7b",
        "now": now,
        "replicas": tuple(replicas),
        "min_replicas": 1,
        "max_replicas": 8,
        "target_queue_per_replica": 4.0,
        "target_kv_usage": 0.75,
        "target_utilisation": 0.75,
        "max_num_seqs": 64,
        "ttft_slo_s": 0.3,
        "cold_start_s": 30.0,
    }
    fields.update(overrides)
    return ScalingContext(**fields)


def autoscaling(**overrides: Any) -> AutoscalingSpec:
    base: dict[str, Any] = {"scale_down_stabilization_s": 60.0, "max_scale_up_step": 4, "max_scale_down_step": 1}
    base.update(overrides)
    return AutoscalingSpec(**base)


def report(
    replica: str, pool: str = "qwen-7b", state: str = "ready", ts: float | None = None, **load: Any
) -> LoadReport:
    fields: dict[str, Any] = {
        "replica": replica,
        "pool": pool,
        "engine_url": f"http://127.0.0.1:1/{replica}",
        "state": state,
        "waiting": 0.0,
        "running": 0.0,
        "kv_usage": 0.0,
        "ttft_p99_s": 0.05,
        "model": "qwen2.5-7b-instruct",
        "engine_version": "sim-0.33.0",
        "ts": time.time() if ts is None else ts,
    }
    fields.update(load)
    return LoadReport(**fields)


def gateway_report(gateway: str = "gw-a", pool: str = "qwen-7b", ts: float | None = None, **load: Any) -> GatewayReport:
    fields: dict[str, Any] = {
        "gateway": gateway,
        "pool": pool,
        "waiting": 0,
        "in_flight": 0,
        "arrived_per_s": 0.0,
        "admitted_per_s": 0.0,
        "window_s": 10.0,
        "ts": time.time() if ts is None else ts,
    }
    fields.update(load)
    return GatewayReport(**fields)
