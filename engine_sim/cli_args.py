"""The ``llmfleet sim serve`` command line: vLLM's flags with their 0.33 names and defaults, then the simulator's own
and the fault-injection family (`engine_sim.cli` turns them into a running server; its docstring says what each
does)."""

from __future__ import annotations

import argparse

from engine_sim.kv_events import parse_kv_events_config
from engine_sim.kv_transfer import parse_kv_transfer_config
from fleet.capacity.catalog import GPUS

__all__ = ["add_arguments", "add_serve_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_command", required=True, metavar="serve")
    serve = sub.add_parser("serve", help="serve MODEL like `vllm serve MODEL`, on a simulated GPU")
    add_serve_arguments(serve)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model name (a catalogue entry, or any name with --model-facts)")
    v = p.add_argument_group("vLLM flags")
    v.add_argument("--host", default=None, help="bind address (default: all interfaces)")
    v.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (logged)")
    v.add_argument("--served-model-name", nargs="+", default=None)
    v.add_argument("--runner", choices=["auto", "generate", "pooling"], default="auto", help="pooling: /v1/embeddings")
    v.add_argument("--tokenizer", default=None, help="tokenizer folder (tokenizer.json, chat template); default: none")
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    v.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    v.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    v.add_argument("--num-gpu-blocks-override", type=int, default=None)
    v.add_argument("--max-model-len", type=int, default=None, help="default: the model's max position")
    v.add_argument("--max-num-seqs", type=int, default=None, help="default: 256 on A100, 1024 on >=70 GB GPUs")
    v.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: 2048 on A100, else 8192")
    v.add_argument("--long-prefill-token-threshold", type=int, default=0)
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    v.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    v.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default: 16; CPU build: 128)")
    v.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "half"])
    v.add_argument("--kv-cache-dtype", default="auto", choices=["auto"])
    v.add_argument("--shutdown-timeout", type=float, default=0.0)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--api-key", default=None)
    v.add_argument("--enable-prompt-tokens-details", action="store_true")
    v.add_argument("--enable-force-include-usage", action="store_true")
    v.add_argument("--enable-request-id-headers", action="store_true")
    v.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False)
    v.add_argument("--disable-log-stats", action="store_true")
    v.add_argument("--disable-uvicorn-access-log", action="store_true")
    v.add_argument("--uvicorn-log-level", default="info")
    v.add_argument("--trust-remote-code", action="store_true")
    v.add_argument("--download-dir", default=None)
    v.add_argument("--enforce-eager", action="store_true")
    v.add_argument("--enable-lora", action="store_true")
    v.add_argument("--lora-modules", nargs="+", default=None, help="name=path or JSON, one per adapter")
    v.add_argument("--max-loras", type=int, default=1)
    v.add_argument("--max-lora-rank", type=int, default=16)
    v.add_argument("--max-cpu-loras", type=int, default=None)
    v.add_argument("--enable-sleep-mode", action="store_true", help="sleep/wake endpoints (VLLM_SERVER_DEV_MODE=1)")
    _add_kv_connector_arguments(v)
    s = p.add_argument_group("simulator flags")
    s.add_argument(
        "--gpu-profile", default="a100-80gb", choices=sorted(GPUS), help="cpu-tiny: vLLM's CPU build on two cores"
    )
    s.add_argument("--time-scale", type=float, default=1.0, help="run the model clock X times faster than wall")
    s.add_argument("--startup-seconds", type=float, default=2.0, help="wall seconds the port refuses connections")
    s.add_argument("--jitter", type=float, default=0.0, help="log-normal sigma of step-time noise")
    s.add_argument("--degradation-per-72h", type=float, default=0.0, help="throughput loss per 72 h of uptime")
    s.add_argument("--model-facts", default=None, help="JSON (or @file) of fleet.capacity.catalog.ModelFacts fields")
    f = p.add_argument_group("fault injection")
    f.add_argument("--fault-crash-after-requests", type=int, default=None)
    f.add_argument("--fault-crash-at-seconds", type=float, default=None)
    f.add_argument("--fault-hang", action="store_true")
    f.add_argument("--fault-slowdown", type=float, default=1.0)
    f.add_argument("--fault-error-rate", type=float, default=0.0)
    f.add_argument("--fault-error-status", type=int, default=500)
    f.add_argument("--fault-die-mid-stream-after-tokens", type=int, default=None)
    f.add_argument("--fault-wake-changes-tokens", action="store_true", help="every wake returns other weights")
    f.add_argument("--fault-exit-delay", type=float, default=0.5, help="seconds from an engine crash to exit")


def _add_kv_connector_arguments(v: argparse._ArgumentGroup) -> None:
    """The KV cache's outward flags: its events (`engine_sim.kv_events`) and its transfer (`engine_sim.kv_transfer`)."""
    v.add_argument("--kv-events-config", type=parse_kv_events_config, default=None, help="KVEventsConfig JSON")
    v.add_argument(
        "--kv-transfer-config", type=parse_kv_transfer_config, default=None, help="KVTransferConfig JSON (NIXL P/D)"
    )
