"""engine_sim: a vLLM-compatible engine simulator driven by a shared, clock-agnostic step model.

Layers, bottom up: `tokenizer` (deterministic token counts), `kv` (paged blocks and the prefix cache),
`timing` (step seconds from `fleet.capacity.perf.StepTimeModel`), `scheduler` (the pure V1-style step loop),
`engine` (the asyncio real-time driver), `server` (vLLM's HTTP surface), `cli` (`llmfleet sim serve`).
"""

from __future__ import annotations

__all__ = ["VLLM_VERSION"]

# The vLLM release whose HTTP surface, metrics and flags the simulator reproduces.
VLLM_VERSION = "0.33.0"
