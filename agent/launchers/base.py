"""Launcher base: turn a pool spec into an engine command line and start it as a supervised child process.

A launcher is a small class registered by name (the pool's ``engine.kind``) through ``__init_subclass__``.
It has one verb, `argv` (pure: pool spec -> argument list), and a shared `start` that runs the command in its
own process group with its output appended to a log file through the agent, which reads each line as it arrives
(`agent.launchers.output`). The agent SIGTERMs only the engine's main process
(vLLM's API server coordinates the drain of its engine-core children) and SIGKILLs the whole group when the
grace runs out, so no orphaned GPU worker survives its supervisor. On Linux the engine is also SIGTERMed by the
kernel when the agent dies, SIGKILL included (``PR_SET_PDEATHSIG``): an engine never outlives the agent that would
report, drain and restart it.

The engine's environment is the agent's minus the control credentials (an engine never calls the control plane),
with the engine key ``$LLMFLEET_ENGINE_API_KEY`` handed over as ``$VLLM_API_KEY``, which vLLM and the simulator
read like ``--api-key``; the key never appears on a command line or in the log. With ``engine.sleepMode`` the engine
gets ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` (exactly ``1``: vLLM reads it as ``bool(int(...))``),
without which vLLM 0.33 serves no ``/sleep`` or ``/wake_up`` (docs/agent.md cites the source lines). With
``engine.responsesStore`` it gets ``VLLM_ENABLE_RESPONSES_API_STORE=1``, without which vLLM keeps no response.
A prefill or decode pool's engine (``PoolSpec.role``) gets ``--kv-transfer-config`` and NIXL's side channel in its
environment (`agent.launchers.kv_transfer`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from agent.gpus import Device
from agent.launchers.kv_transfer import SideChannel, kv_transfer_env, kv_transfer_flags
from agent.launchers.output import EngineOutput
from fleet.protocol.control_auth import CONTROL_TOKEN_ENV, CONTROL_TOKEN_FILE_ENV, ENGINE_API_KEY_ENV
from fleet.spec.plugins import ENGINE_KIND, Registry
from fleet.spec.stack import PoolSpec

__all__ = ["REGISTRY", "REMOVED_FLAGS", "EngineHandle", "EngineProcess", "LaunchConfig", "Launcher", "make_launcher"]

REGISTRY: Registry[Launcher] = Registry(ENGINE_KIND)

ENGINE_KEY_FOR_ENGINE = "VLLM_API_KEY"  # vLLM's own variable for --api-key
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM's switch for its development endpoints, sleep and wake among them
RESPONSES_STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"  # vLLM keeps /v1/responses answers (engine.responsesStore)

GPU_MEMORY_FLAG = "--gpu-memory-utilization"
SLEEP_MODE_FLAG = "--enable-sleep-mode"
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM on CPU: GiB of host memory for the KV cache (read with int())

_OUTPUT_TAIL_S = 2.0  # after the engine exits, how long `wait` gives its last output to reach the log

# Flags the pinned vLLM release rejects ("unrecognized arguments"): never pass them, reject them in extraArgs.
REMOVED_FLAGS = frozenset({"--disable-log-requests", "--swap-space"})


class EngineHandle(Protocol):
    """A running engine as the supervisor sees it (a real child process, or a fake in unit tests)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def terminate(self) -> None:
        """SIGTERM the engine's main process: it drains within its --shutdown-timeout."""

    def kill(self) -> None:
        """SIGKILL the engine's whole process group."""


@dataclass(frozen=True)
class LaunchConfig:
    """Where and how this replica's engine runs."""

    host: str  # interface the engine binds
    port: int
    log_path: Path | None = None  # engine stdout+stderr; None: inherit the agent's
    extra_args: Sequence[str] = ()  # appended after the spec's engine.extraArgs (e.g. simulator fault flags)
    model_dir: str | None = None  # weights fetched from the model store; None: the pool's model id (the Hub)
    adapter_dirs: Mapping[str, str] = field(default_factory=dict)  # LoRA adapter name -> its fetched directory
    env: Mapping[str, str] = field(default_factory=dict)
    kv_events_port: int | None = None  # engine.kvEvents: the PUB socket's port
    replica: str = ""  # in the KV events' topic
    device: Device = "gpu"  # decided once when the agent starts (`agent.gpus.device_of`); see `dropped_flags`
    side_channel: SideChannel | None = None  # a P/D pool's engines: NIXL's handshake listener (`kv_transfer`)


class EngineProcess:
    """An engine child process in its own session/process group, and the task copying its output (if piped)."""

    def __init__(self, process: asyncio.subprocess.Process, output: asyncio.Task[None] | None = None) -> None:
        self._process = process
        self._output = output

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        """The exit code, once the engine exited and its last output reached the log (or ``_OUTPUT_TAIL_S`` passed:
        a child that outlives it may still hold the pipe; the copy then ends when that child does)."""
        code = await self._process.wait()
        if self._output is not None:
            await asyncio.wait({self._output}, timeout=_OUTPUT_TAIL_S)
        return code

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._process.pid, signal.SIGTERM)

    def kill(self) -> None:
        # The group id equals the pid (start_new_session); it outlives the leader while children remain.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)


class Launcher(abc.ABC):
    """One engine kind: ``argv`` builds its command line from the pool spec; ``start`` runs it."""

    name: ClassVar[str]

    def __init_subclass__(cls, *, name: str, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        REGISTRY.register(name, cls)

    def __init__(self, pool: PoolSpec, config: LaunchConfig) -> None:
        self.pool = pool
        self.config = config

    @abc.abstractmethod
    def argv(self) -> list[str]:
        """The exact command line (pure)."""

    @property
    def model(self) -> str:
        """What the engine loads: the local model directory when there is one, else the pool's model id. The
        served name stays the pool's either way (``--served-model-name``), so clients see no difference."""
        return self.config.model_dir or self.pool.model

    def dropped_flags(self) -> dict[str, str]:
        """The spec's flags this kind leaves out on this launch's device, each with the reason: none by default."""
        return {}

    @property
    def on_cpu(self) -> bool:
        """Whether the engine runs (or plays an engine that runs) on a CPU: the launch's device by default."""
        return self.config.device == "cpu"

    def common_flags(self) -> list[str]:
        """The ``vllm serve`` flags every kind shares, from the pool spec (0.33 names), less `dropped_flags`."""
        engine, cfg, dropped = self.pool.engine, self.config, self.dropped_flags()
        flags = [
            "--host", cfg.host,
            "--port", str(cfg.port),
            "--served-model-name", self.pool.served_name,
            "--tensor-parallel-size", str(engine.tensor_parallel_size),
        ]  # fmt: skip
        if GPU_MEMORY_FLAG not in dropped:
            flags += [GPU_MEMORY_FLAG, _num(engine.gpu_memory_utilization)]
        flags += [
            "--max-model-len", str(engine.max_model_len),
            "--max-num-seqs", str(engine.max_num_seqs),
            "--max-num-batched-tokens", str(engine.max_num_batched_tokens),
            "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching",
        ]  # fmt: skip
        if engine.dtype != "auto":
            flags += ["--dtype", engine.dtype]
        # Drain mode (vLLM >= 0.18): in-flight requests get the rest of the grace after the propagation delay.
        flags += ["--shutdown-timeout", str(self.pool.drain.engine_shutdown_timeout)]
        if engine.runner != "generate":  # vLLM's default (auto) serves a generative model generating
            flags += ["--runner", engine.runner]
        if engine.sleep_mode and SLEEP_MODE_FLAG not in dropped:
            flags.append(SLEEP_MODE_FLAG)
        if engine.tokenizer is not None:  # the folder gateways tokenize with too (kv-cache)
            flags += ["--tokenizer", engine.tokenizer]
        return flags + self.kv_events_flags() + self.lora_flags() + kv_transfer_flags(self.pool, self.on_cpu)

    def kv_events_flags(self) -> list[str]:
        """``--kv-events-config`` (engine.kvEvents): a ZMQ PUB socket bound on every interface (vLLM binds an
        endpoint with ``*`` and connects any other), its topic naming the replica and the served model."""
        port = self.config.kv_events_port
        if not self.pool.engine.kv_events or port is None:
            return []
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{port}",
            "topic": f"kv@{self.config.replica}@{self.pool.served_name}",
        }
        return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]

    def lora_flags(self) -> list[str]:
        """``--enable-lora`` and one ``--lora-modules name=path`` per adapter: its fetched directory, else its
        source id (vLLM resolves a Hub id itself). Nothing without adapters."""
        adapters, engine = self.pool.adapters, self.pool.engine
        if not adapters:
            return []
        flags = ["--enable-lora", "--max-loras", str(engine.max_loras), "--max-lora-rank", str(engine.max_lora_rank)]
        if engine.max_cpu_loras is not None:
            flags += ["--max-cpu-loras", str(engine.max_cpu_loras)]
        dirs = self.config.adapter_dirs
        return [*flags, "--lora-modules", *(f"{a.name}={dirs.get(a.name, a.source)}" for a in adapters)]

    def extra_flags(self) -> list[str]:
        """``engine.extraArgs`` then the launch config's extras; ValueError for flags vLLM removed."""
        extra = [*self.pool.engine.extra_args, *self.config.extra_args]
        removed = sorted({a.split("=", 1)[0] for a in extra} & REMOVED_FLAGS)
        if removed:
            raise ValueError(f"engine flags removed from vLLM {self.pool.engine.version}: {', '.join(removed)}")
        return extra

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (CONTROL_TOKEN_ENV, CONTROL_TOKEN_FILE_ENV)}
        key = env.pop(ENGINE_API_KEY_ENV, None)
        if key:
            env[ENGINE_KEY_FOR_ENGINE] = key
        if self.pool.engine.sleep_mode:
            env[DEV_MODE_ENV] = "1"
        if self.pool.engine.responses_store:
            env[RESPONSES_STORE_ENV] = "1"  # read as bool(int(...)), like the dev mode's
        env.update(kv_transfer_env(self.pool, self.on_cpu, self.config.side_channel, env))
        return {**env, **self.config.env}

    def cpu_dropped_flags(self, engine: str, kv_cache: str) -> dict[str, str]:
        """The flags a CPU build of vLLM (``engine`` names it in the reasons) cannot take, and why: the GPU memory
        share (``kv_cache``: what the KV cache gets instead) and, when the pool asks for it, sleep mode."""
        dropped = {GPU_MEMORY_FLAG: f"{engine} reserves that share of the host's memory; the KV cache gets {kv_cache}"}
        if self.pool.engine.sleep_mode:
            dropped[SLEEP_MODE_FLAG] = (
                f"{engine} refuses to start with it; /sleep and /wake_up still answer (dev mode) but free nothing"
            )
        return dropped

    def with_cpu_kv_cache(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with ``engine.cpuKvCacheGib`` as the CPU build's KV-cache size, unless ``env`` already sets one."""
        if not env.get(CPU_KV_CACHE_ENV):
            env[CPU_KV_CACHE_ENV] = str(self.pool.engine.cpu_kv_cache_gib)
        return env

    async def start(self, on_line: Callable[[str], None] | None = None) -> EngineProcess:
        """Start the engine in a new session (its own process group), its output appended to ``log_path`` and each
        of its lines passed to ``on_line`` as it arrives. Without a ``log_path`` the engine writes to the agent's
        own stdout and stderr, and ``on_line`` hears nothing."""
        argv = self.argv()
        log_path = self.config.log_path
        agent = os.getpid()
        if log_path is None:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=self.environment(),
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=lambda: _dies_with(agent),
            )
            return EngineProcess(process)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("ab")
        try:
            log.write(f"--- llmfleet agent: starting {' '.join(argv)}\n".encode())
            log.flush()
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=self.environment(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _dies_with(agent),
            )
        except BaseException:
            log.close()
            raise
        assert process.stdout is not None
        output = EngineOutput(process.stdout, log, on_line or _ignore)
        return EngineProcess(process, output.start())


def _ignore(line: str) -> None:
    del line  # Unused: nobody reads this engine's lines.


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with(parent: int) -> None:
    """Run in the engine's process before exec: ask for SIGTERM when ``parent`` (the agent) dies, and act on it at
    once if the agent died between the fork and here."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def make_launcher(pool: PoolSpec, config: LaunchConfig) -> Launcher:
    """The launcher for ``pool.engine.kind``; `fleet.spec.plugins.UnknownPlugin` (a ValueError) lists the kinds."""
    return REGISTRY.get(pool.engine.kind)(pool, config)


def _num(value: float) -> str:
    """0.9 -> "0.9", 2.0 -> "2" (what a person would type)."""
    return f"{value:g}"
