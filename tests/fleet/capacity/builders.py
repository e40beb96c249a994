"""Pools for the paid-capacity tests: Qwen2.5-7B on the aws preset's ``a100`` group, sized by the test."""

from __future__ import annotations

from typing import Any


def a100_pool(
    name: str, tp: int, replicas: tuple[int, int], fill_paid: bool | None = None, **extra: Any
) -> dict[str, Any]:
    """A pool document on the ``a100`` group with ``tp`` GPUs a replica, ``replicas`` (min, max), its
    ``fillPaidNodes`` where given, and ``extra`` top-level keys."""
    more = {} if fill_paid is None else {"fillPaidNodes": fill_paid}
    return {
        "name": name,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "servedModelName": name,
        "nodeGroup": "a100",
        "engine": {"kind": "vllm", "maxNumSeqs": 256, "tensorParallelSize": tp},
        "replicas": {"min": replicas[0], "max": replicas[1], **more},
        "drain": {"graceSeconds": 345, "propagationSeconds": 10},  # covers the gateway's 330 s requests
        **extra,
    }
