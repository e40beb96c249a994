"""CLI: ``llmfleet sim serve MODEL [flags]``, the same command line as ``vllm serve MODEL``.

Every flag the agent passes to ``vllm serve`` is accepted with vLLM 0.33's name and default; unknown flags
fail as vLLM does (``error: unrecognized arguments``), so a launcher that passes a removed flag such as
``--swap-space`` breaks here too. Simulator-only flags: ``--gpu-profile``, ``--time-scale``,
``--startup-seconds``, ``--jitter``, ``--degradation-per-72h``, ``--model-facts`` and the ``--fault-*`` family
(see `engine_sim.faults`). ``--seed`` is vLLM's own flag and also seeds jitter and injected errors.
``--enable-sleep-mode`` is vLLM's: with ``VLLM_SERVER_DEV_MODE=1`` in the environment (read as vLLM reads it,
``bool(int(value))``, so ``true`` fails at startup) the sleep-mode endpoints are served (`engine_sim.sleep`);
``VLLM_SERVER_DEV_MODE=1`` alone serves ``/reset_prefix_cache``. ``--gpu-profile cpu-tiny`` plays vLLM's CPU build
(`engine_sim.platform`): ``/version`` 0.32.0, 128-token KV blocks (``--block-size`` 16 refused at start, as there),
``--enable-sleep-mode`` refused at start, dev mode alone serving sleep routes that free nothing, the KV cache sized
by ``VLLM_CPU_KVCACHE_SPACE`` (GiB) when set, and the CPU engine's measured step times.
``--kv-events-config`` publishes vLLM's KV-cache
events over ZMQ (`engine_sim.kv_events`, `engine_sim.kv_publisher`), hashed with ``$PYTHONHASHSEED`` and
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` as vLLM reads them. ``--kv-transfer-config`` configures vLLM's NixlConnector
(`engine_sim.kv_transfer`): its side channel listens on ``VLLM_NIXL_SIDE_CHANNEL_HOST:PORT`` and requests' P/D
``kv_transfer_params`` are played (`engine_sim.nixl`, `engine_sim.pd_legs`). ``--tokenizer PATH`` is vLLM's flag
("Name or path of the Hugging Face tokenizer to use"), here a local folder only (``tokenizer.json`` and a chat template,
`fleet.tokenizer`): prompt ids are then the ones vLLM computes with that tokenizer, and without it the
approximate tokenizer counts them (`engine_sim.tokenizer`).

Process lifecycle: the port stays closed (connection refused) for ``--startup-seconds`` like vLLM starting, which
is split into vLLM's load, compile and graph-capture phases, each logged as vLLM logs it (`engine_sim.startup`);
then it serves. SIGTERM/SIGINT: with ``--shutdown-timeout 0`` in-flight requests are aborted at
once; with N > 0 they get up to N wall seconds to finish while new ones get 503 and ``/health`` stays 200.
Exit code 0 after a clean shutdown, 1 after an engine crash or a startup failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
from aiohttp import web

from engine_sim.block_hash import DEFAULT_NONE_HASH_SEED
from engine_sim.cli_args import add_arguments, add_serve_arguments
from engine_sim.config import EngineConfig, num_gpu_blocks
from engine_sim.engine import Engine
from engine_sim.errors import ConfigError
from engine_sim.faults import FaultPolicy, FaultSpec
from engine_sim.kv_events import KVEventsConfig, KVEventSettings
from engine_sim.kv_publisher import ZmqKVEventPublisher
from engine_sim.kv_transfer import KVTransferSettings, settings_from
from engine_sim.lora import LoraSettings, parse_lora_modules
from engine_sim.nixl import NixlConnector, start_nixl
from engine_sim.platform import platform_of
from engine_sim.responses import store_enabled
from engine_sim.server import ServerSettings, create_app
from engine_sim.sleep import SleepController, WakeTiming
from engine_sim.startup import StartupPhases, run_startup
from engine_sim.tokenizer import APPROX, SimTokenizer, load_file_tokenizer
from fleet.capacity.catalog import GIB, GPUS, MODELS, ModelFacts
from fleet.tokenizer import TokenizerError

__all__ = ["add_arguments", "add_serve_arguments", "build", "main", "run"]

log = logging.getLogger("engine_sim")


def _facts(model: str, raw: str | None) -> ModelFacts:
    if raw is None:
        if model in MODELS:
            return MODELS[model]
        raise ConfigError(
            f'unknown model {model!r}: pass --model-facts \'{{"parameters": ..., "layers": ..., ...}}\' '
            f"(fields of fleet.capacity.catalog.ModelFacts) or use one of {sorted(MODELS)}"
        )
    text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    try:
        return ModelFacts(**json.loads(text))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad --model-facts: {exc}") from None


@dataclass(frozen=True)
class ServeOptions:
    config: EngineConfig
    settings: ServerSettings
    faults: FaultSpec
    host: str | None
    port: int
    time_scale: float
    startup_seconds: float
    shutdown_timeout: float
    sleep_routes: bool = False  # --enable-sleep-mode with VLLM_SERVER_DEV_MODE=1 (the CPU build: dev mode alone)
    dev_routes: bool = False  # VLLM_SERVER_DEV_MODE=1
    runner: str = "generate"  # --runner (auto: the simulated models generate)
    kv_transfer: KVTransferSettings | None = None  # --kv-transfer-config with a connector, and its side channel


def build(args: argparse.Namespace) -> ServeOptions:
    """Flags -> options; ConfigError for values vLLM would refuse at startup."""
    facts = _facts(args.model, args.model_facts)
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
    if args.time_scale <= 0:
        raise ConfigError("--time-scale must be > 0")
    names = tuple(args.served_model_name or [args.model])
    dev_mode = _dev_mode(os.environ.get("VLLM_SERVER_DEV_MODE", "0"))
    platform = platform_of(args.gpu_profile)
    platform.check(args.block_size or platform.default_block_size, args.enable_sleep_mode)
    config = _engine_config(args, facts, names)
    kv_transfer = settings_from(args.kv_transfer_config, os.environ, platform.name, args.enable_sleep_mode)
    num_gpu_blocks(config)  # fail before "loading weights", as vLLM does at KV allocation
    settings = ServerSettings(
        model=args.model,
        served_model_names=names,
        max_model_len=config.max_model_len,
        api_key=args.api_key or os.environ.get("VLLM_API_KEY"),
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_force_include_usage=args.enable_force_include_usage,
        enable_request_id_headers=args.enable_request_id_headers,
        tokenizer=_tokenizer(args.tokenizer),
        responses_store=store_enabled(os.environ),
        version=platform.vllm_version,
    )
    return ServeOptions(
        config,
        settings,
        _faults(args),
        args.host,
        args.port,
        args.time_scale,
        args.startup_seconds,
        args.shutdown_timeout,
        sleep_routes=dev_mode and (args.enable_sleep_mode or not platform.sleep_mode),
        dev_routes=dev_mode,
        runner="pooling" if args.runner == "pooling" else "generate",
        kv_transfer=kv_transfer,
    )


def _tokenizer(path: str | None) -> SimTokenizer:
    """``--tokenizer``: a local folder's tokenizer; without the flag the approximate one (vLLM would use the
    model's own, which the simulator does not have)."""
    if path is None:
        return APPROX
    try:
        return load_file_tokenizer(Path(path))
    except TokenizerError as exc:
        raise ConfigError(f"--tokenizer {path}: {exc}") from None


def _dev_mode(value: str) -> bool:
    """``VLLM_SERVER_DEV_MODE`` as vLLM 0.33 parses it (``bool(int(...))``): ``0`` or ``1``, anything else fails."""
    try:
        return bool(int(value))
    except ValueError:
        raise ConfigError(f"VLLM_SERVER_DEV_MODE must be an integer (0 or 1), got {value!r}") from None


def _kv_events(config: KVEventsConfig | None) -> KVEventSettings | None:
    """The flag's config with the hashing environment vLLM reads (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` as
    ``bool(int(...))``, default 1; ``PYTHONHASHSEED`` seeds the root hash when set)."""
    if config is None:
        return None
    raw = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    try:
        int_hashes = bool(int(raw))
    except ValueError:
        raise ConfigError(f"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES must be an integer (0 or 1), got {raw!r}") from None
    return KVEventSettings(config, os.environ.get("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED), int_hashes)


def _cpu_kv_cache_bytes(args: argparse.Namespace) -> int | None:
    """The CPU build's KV cache: ``--kv-cache-memory-bytes``, else ``VLLM_CPU_KVCACHE_SPACE`` GiB (read with int(),
    as vLLM reads it) when set and not 0, else None (sized from the profile's memory, as on a GPU)."""
    flag: int | None = args.kv_cache_memory_bytes
    if flag is not None or platform_of(args.gpu_profile).step_costs is None:
        return flag
    raw = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "0")
    try:
        gib = int(raw)
    except ValueError:
        raise ConfigError(f"VLLM_CPU_KVCACHE_SPACE must be an integer (GiB), got {raw!r}") from None
    return gib * GIB if gib > 0 else None


def _lora(args: argparse.Namespace, names: tuple[str, ...]) -> LoraSettings | None:
    """``--enable-lora`` and its modules; their names may not clash with the served names."""
    if not args.enable_lora:
        if args.lora_modules:
            raise ConfigError("--lora-modules needs --enable-lora")
        return None
    lora = parse_lora_modules(args.lora_modules or [], args.max_loras, args.max_lora_rank, args.max_cpu_loras)
    if set(lora.names) & set(names):
        raise ConfigError(f"--lora-modules names {sorted(set(lora.names) & set(names))} clash with served names")
    return lora


def _engine_config(args: argparse.Namespace, facts: ModelFacts, names: tuple[str, ...]) -> EngineConfig:
    """The engine's sizing and timing flags; vLLM's batch defaults grow on GPUs of 70 GiB and more (not A100s)."""
    gpu = GPUS[args.gpu_profile]
    big = gpu.memory_gib >= 70 and not gpu.name.startswith("a100")
    return EngineConfig(
        model=args.model,
        facts=facts,
        served_model_name=names[0],
        gpu_profile=args.gpu_profile,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len or facts.max_position,
        max_num_seqs=args.max_num_seqs or (1024 if big else 256),
        max_num_batched_tokens=args.max_num_batched_tokens or (8192 if big else 2048),
        enable_prefix_caching=args.enable_prefix_caching,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        kv_cache_memory_bytes=_cpu_kv_cache_bytes(args),
        jitter=args.jitter,
        degradation_per_72h=args.degradation_per_72h,
        slowdown=args.fault_slowdown,
        seed=args.seed,
        lora=_lora(args, names),
        kv_events=_kv_events(args.kv_events_config),
        block_size=args.block_size,
    )


def _faults(args: argparse.Namespace) -> FaultSpec:
    return FaultSpec(
        crash_after_requests=args.fault_crash_after_requests,
        crash_at_seconds=args.fault_crash_at_seconds,
        hang=args.fault_hang,
        slowdown=args.fault_slowdown,
        error_rate=args.fault_error_rate,
        error_status=args.fault_error_status,
        die_mid_stream_after_tokens=args.fault_die_mid_stream_after_tokens,
        wake_changes_tokens=args.fault_wake_changes_tokens,
        exit_delay_s=args.fault_exit_delay,
    )


def _die_now() -> None:
    log.error("injected fault: process dies mid-stream")
    logging.shutdown()
    os._exit(1)


def _sleep_controller(opts: ServeOptions, engine: Engine) -> SleepController | None:
    if not opts.sleep_routes:
        return None
    log.warning("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in production!")
    return SleepController(
        engine,
        WakeTiming.for_config(opts.config),
        opts.faults.wake_changes_tokens,
        frees_memory=opts.config.platform.sleep_mode,
    )


async def _start_publisher(config: EngineConfig, engine: Engine) -> ZmqKVEventPublisher | None:
    """The KV-event publisher wired to ``engine`` (None without one); ConfigError when a socket cannot be opened."""
    if config.kv_events is None or not config.kv_events.config.publishes:
        return None
    publisher = ZmqKVEventPublisher(config.kv_events.config)
    try:
        publisher.start()
    except zmq.ZMQError as exc:
        await publisher.close()
        raise ConfigError(f"--kv-events-config: cannot open its sockets: {exc}") from None
    engine.on_kv_events = publisher.publish
    return publisher


async def _drain(engine: Engine, timeout_s: float) -> None:
    """The clean shutdown: refuse new requests, let in-flight ones finish for up to ``timeout_s``, abort the rest."""
    log.info("[shutdown] API server: shutdown triggered (timeout %.1f s)", timeout_s)
    engine.begin_drain()
    if timeout_s > 0:
        try:
            await asyncio.wait_for(engine.wait_idle(), timeout=timeout_s)
        except TimeoutError:
            log.warning("[shutdown] drain timed out; aborting %d requests", len(engine.streams))
    engine.abort_all()


def _app(
    opts: ServeOptions, engine: Engine, on_crash: Callable[[], None], nixl: NixlConnector | None
) -> web.Application:
    """The HTTP app over ``engine``, with the fault policy, sleep mode and NIXL connector the options ask for."""
    policy = FaultPolicy(opts.faults, seed=opts.config.seed)
    sleep = _sleep_controller(opts, engine)
    return create_app(
        engine,
        opts.settings,
        policy,
        on_crash,
        _die_now,
        sleep,
        dev_routes=opts.dev_routes,
        runner=opts.runner,
        nixl=nixl,
    )


async def serve(opts: ServeOptions) -> int:
    """Run one simulated replica until SIGTERM/SIGINT or a crash; returns the exit code. ConfigError when the
    KV-event sockets cannot be opened (after the start phases, where vLLM's engine core opens them)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    exit_code = 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "Loading weights of %s on a simulated %s (%.1f s)",
        opts.config.model,
        opts.config.gpu.name,
        opts.startup_seconds,
    )
    platform = opts.config.platform
    interrupt = stop if platform.stops_while_starting else asyncio.Event()  # the CPU build ignores it
    if await run_startup(StartupPhases.split(opts.startup_seconds, opts.config), interrupt, log, platform):
        return 0  # terminated while starting
    stop.clear()  # a SIGTERM the start ignored is lost, as on the CPU build
    engine = Engine(opts.config, time_scale=opts.time_scale)
    publisher = await _start_publisher(opts.config, engine)
    nixl = None if opts.kv_transfer is None else await start_nixl(opts.kv_transfer, engine)
    engine.start()
    blocks = engine.scheduler.kv.pool.num_blocks
    log.info("GPU KV cache size: %d tokens (%d blocks)", blocks * opts.config.block_tokens, blocks)

    def on_crash() -> None:
        nonlocal exit_code
        exit_code = 1
        log.error("EngineCore died (injected fault); exiting in %.1f s", opts.faults.exit_delay_s)
        loop.call_later(opts.faults.exit_delay_s, stop.set)

    app = _app(opts, engine, on_crash, nixl)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, opts.host, opts.port, reuse_address=True)
    await site.start()
    for address in runner.addresses:
        log.info("Starting vLLM API server 0 on http://%s:%s", *address[:2])
    log.info("Application startup complete.")
    if opts.faults.crash_at_seconds is not None:

        def crash_at() -> None:
            engine.kill()
            on_crash()

        loop.call_later(opts.faults.crash_at_seconds, crash_at)
    await stop.wait()
    if exit_code == 0:
        await _drain(engine, opts.shutdown_timeout)
    await runner.cleanup()
    await engine.stop()
    if publisher is not None:
        await publisher.close()
    if nixl is not None:
        await nixl.close()
    return exit_code


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(asctime)s [engine_sim] %(message)s", stream=sys.stderr
    )
    try:
        return asyncio.run(serve(build(args)))
    except ConfigError as exc:
        log.error("%s", exc)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_sim", description="vLLM-compatible engine simulator")
    add_arguments(parser)
    return run(parser.parse_args(argv))
