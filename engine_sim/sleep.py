"""Sleep: vLLM 0.33's sleep mode on the simulator (``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``).

    POST /sleep?level=L&mode=M   L in 0..2 (default 1), M in abort (default) | wait | keep
                                 -> 200 {"status": "sleeping", "level": L} once asleep
    POST /wake_up[?tags=T ...]   T in weights | kv_cache | scheduling; none: everything
                                 -> 200 {"status": "awake" | "sleeping", "tags": [...] | null}
    GET  /is_sleeping            -> {"is_sleeping": bool}
    POST /collective_rpc         {"method": "reload_weights"} -> {"results": [null]}: the level-2 refill

What a level does, as in vLLM (`engine_sim` mirrors, it does not share code): level 0 only pauses scheduling;
level 1 copies the weights to host memory and discards the KV cache (and the prefix cache with it); level 2
discards both, so the weights are garbage after the wake until ``reload_weights``. While asleep the scheduler
takes no step: a request that arrives is queued and answered after the wake (vLLM's behaviour, which is why a
router must stop sending before a sleep); ``/health`` stays 200. ``mode=abort`` finishes in-flight requests with
``finish_reason: "abort"`` first, ``wait`` lets them finish, ``keep`` freezes them until the wake.

Timing (`WakeTiming`, calibrated in docs/engine-simulator.md): moving the weights across PCIe takes
``weight bytes per GPU / host-to-device bandwidth + fixed_s``, the same for the sleep's copy out and the wake's
copy in; a move that copies no weights (level 0, level 2's discard, a ``kv_cache``-only wake) takes ``fixed_s``.
Seconds are the model clock's (divided by ``--time-scale`` in wall time), like every engine step.

Series: ``vllm:engine_sleep_state{engine,model_name,sleep_state}`` (awake / weights_offloaded / discard_all:
awake=1 when awake, weights_offloaded=1 at level 1, discard_all=1 at level 2, all 0 at level 0) and, from the
first sleep or wake on, ``vllm:sleep_mode_operation_duration_seconds{operation}``.

On vLLM's CPU build (``frees_memory=False``, `engine_sim.platform.CPU`) the routes answer the same and scheduling
pauses, but nothing moves: the worker logs ``sleep mode is not supported on CPU, ignore it``, the weights stay (a
level-2 wake answers as before), and a sleep or wake takes no model time (0.01 s measured there). The engine core
still resets the prefix cache at level 1 or 2, as vLLM's does on every platform.

Fault (``--fault-wake-changes-tokens``): every wake returns with different weights, so a greedy request gives
other tokens than before the sleep, the way a level-2 wake without a reload does.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Gauge, Histogram

from engine_sim.config import EngineConfig
from engine_sim.engine import Engine
from fleet.capacity.plan import weight_bytes

__all__ = ["HOST_TO_DEVICE_BYTES_S", "SleepController", "SleepState", "WakeTiming", "add_sleep_routes"]

# Pinned host-to-device copy bandwidth per GPU, fitted to the published level-1 wake times (see
# docs/engine-simulator.md): A100 (PCIe 4.0) from the vLLM blog's Qwen3-0.6B and Qwen3-Coder-30B-A3B wakes, H100
# (PCIe 5.0) from vllm#48310's Qwen3-8B wake. GPUs without a published figure take their PCIe generation's.
_PCIE4, _PCIE5 = 22.8e9, 42.0e9
HOST_TO_DEVICE_BYTES_S: dict[str, float] = {
    "a100-40gb": _PCIE4,
    "a100-80gb": _PCIE4,
    "h100-80gb": _PCIE5,
    "h200-141gb": _PCIE5,
    "a10g-24gb": _PCIE4,
    "l4-24gb": _PCIE4,
    "l40s-48gb": _PCIE4,
}
FIXED_S = 0.2  # the part of a move that is not the copy (remapping, CUDA-graph pools): both fits' intercept
_OPERATION_BUCKETS = (0.01, 0.1, 1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_TAGS = ("weights", "kv_cache")
_WAKE_TAGS = frozenset({*_TAGS, "scheduling"})
log = logging.getLogger("engine_sim")


class SleepState(enum.Enum):
    """The ``sleep_state`` label values of ``vllm:engine_sleep_state``."""

    AWAKE = "awake"
    WEIGHTS_OFFLOADED = "weights_offloaded"
    DISCARD_ALL = "discard_all"


@dataclass(frozen=True)
class WakeTiming:
    """How long a sleep or wake moves weights: ``weight_bytes / bandwidth + fixed_s`` model seconds."""

    weight_bytes: float  # per GPU: the model's weights over its tensor-parallel ranks
    bandwidth_bytes_s: float
    fixed_s: float = FIXED_S

    @classmethod
    def for_config(cls, config: EngineConfig) -> WakeTiming:
        per_gpu = weight_bytes(config.facts) / config.tensor_parallel_size
        return cls(per_gpu, HOST_TO_DEVICE_BYTES_S.get(config.gpu_profile, _PCIE4))

    def move_s(self, copies_weights: bool) -> float:
        return self.fixed_s + (self.weight_bytes / self.bandwidth_bytes_s if copies_weights else 0.0)


class SleepError(ValueError):
    """A sleep or wake argument vLLM refuses (400)."""


class SleepController:
    """The sleep state of one engine: which tags are asleep, at what level, and whether the weights are good."""

    def __init__(
        self, engine: Engine, timing: WakeTiming, wake_changes_tokens: bool = False, frees_memory: bool = True
    ) -> None:
        self.engine = engine
        self.timing = timing
        self.frees_memory = frees_memory  # False: the CPU build, whose sleep pauses but moves and discards nothing
        self.wake_changes_tokens = wake_changes_tokens
        self.level: int | None = None  # None: awake
        self.asleep: set[str] = set()  # tags still asleep (weights, kv_cache) and "scheduling" while paused
        self.weights_good = True
        self.seed_shift = 0  # added to every request's output seed: other weights give other tokens
        self._clock = engine.clock
        registry, (model_name, engine_label) = engine.metrics.registry, engine.metrics.label_values
        self._gauge = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            ["engine", "model_name", "sleep_state"],
            registry=registry,
        )
        self._labels = (engine_label, model_name)
        self._durations: Histogram | None = None
        self._set_gauge()

    @property
    def is_sleeping(self) -> bool:
        return bool(self.asleep)

    def _set_gauge(self) -> None:
        values = {s: 0.0 for s in SleepState}
        if self.level is None:
            values[SleepState.AWAKE] = 1.0
        elif self.level == 1:
            values[SleepState.WEIGHTS_OFFLOADED] = 1.0
        elif self.level == 2:
            values[SleepState.DISCARD_ALL] = 1.0
        for state, value in values.items():
            self._gauge.labels(*self._labels, state.value).set(value)

    def _observe(self, operation: str, seconds: float) -> None:
        if self._durations is None:  # vLLM creates it on the first dev-endpoint call
            self._durations = Histogram(
                "vllm:sleep_mode_operation_duration_seconds",
                "Duration of sleep mode operations in seconds.",
                ["operation"],
                buckets=_OPERATION_BUCKETS,
                registry=self.engine.metrics.registry,
            )
        self._durations.labels(operation).observe(seconds)

    async def _take(self, model_s: float) -> None:
        await self._clock.sleep(model_s / self.engine.time_scale)

    async def sleep(self, level: int, mode: str) -> None:
        """Pause scheduling, settle in-flight requests by ``mode``, then free what ``level`` frees."""
        if level not in (0, 1, 2):
            raise SleepError(f"level must be 0, 1 or 2, got {level}")
        if mode not in ("abort", "wait", "keep"):
            raise SleepError(f"mode must be abort, wait or keep, got {mode!r}")
        if self.is_sleeping:
            return
        if mode == "abort":
            self.engine.abort_all()
        elif mode == "wait":
            await self.engine.wait_idle()
        self.engine.pause()
        self.level, self.asleep = level, {"scheduling", *(_TAGS if level >= 1 else ())}
        seconds = self.timing.move_s(copies_weights=level == 1) if level >= 1 and self.frees_memory else 0.0
        if not self.frees_memory:
            log.warning("sleep mode is not supported on CPU, ignore it")
        if level >= 1:
            self.engine.reset_prefix_cache()  # the KV cache is discarded (the engine core does it on CPU too)
            self.weights_good = self.weights_good and (level == 1 or not self.frees_memory)
        await self._take(seconds)
        self._observe("sleep", seconds)
        self._set_gauge()

    async def wake_up(self, tags: list[str]) -> bool:
        """Wake ``tags`` (all when empty); True when fully awake, which is when scheduling resumes."""
        unknown = sorted(set(tags) - _WAKE_TAGS)
        if unknown:
            raise SleepError(f"unknown tags {unknown}; known: {sorted(_WAKE_TAGS)}")
        waking = set(tags) if tags else set(self.asleep)
        copies = "weights" in waking & self.asleep and self.level == 1
        moves = waking & self.asleep & set(_TAGS) and self.frees_memory
        seconds = self.timing.move_s(copies) if moves else 0.0
        await self._take(seconds)
        self.asleep -= waking
        if self.level != 0 and not self.asleep & set(_TAGS):
            self.asleep.discard("scheduling")  # after a level >= 1 sleep, scheduling resumes once all is awake
        if self.asleep:
            return False
        if self.level is not None:
            self._observe("wake", seconds)
            if self.wake_changes_tokens or not self.weights_good:
                self.seed_shift += 1
        self.level = None
        self._set_gauge()
        self.engine.resume()
        return True

    async def reload_weights(self) -> None:
        """``collective_rpc reload_weights``: weights read again (from disk: the same copy time), tokens as before."""
        await self._take(self.timing.move_s(copies_weights=True))
        self.weights_good, self.seed_shift = True, 0


def add_sleep_routes(
    app: web.Application, controller: SleepController, error: Callable[[int, str], web.Response]
) -> None:
    """The sleep-mode routes on ``app``; ``error`` renders a vLLM error body."""

    async def sleep(request: web.Request) -> web.Response:
        try:
            level = int(request.query.get("level", "1"))
            await controller.sleep(level, request.query.get("mode", "abort"))
        except ValueError as exc:  # SleepError, or a level that is not an integer
            return error(400, str(exc))
        return web.json_response({"status": "sleeping", "level": controller.level})

    async def wake_up(request: web.Request) -> web.Response:
        try:
            awake = await controller.wake_up(request.query.getall("tags", []))
        except SleepError as exc:
            return error(400, str(exc))
        tags = sorted(controller.asleep) or None
        return web.json_response({"status": "awake" if awake else "sleeping", "tags": tags})

    async def is_sleeping(request: web.Request) -> web.Response:
        del request  # Unused.
        return web.json_response({"is_sleeping": controller.is_sleeping})

    async def collective_rpc(request: web.Request) -> web.Response:
        try:
            method = (await request.json()).get("method")
        except (ValueError, AttributeError):
            return error(400, "body must be a JSON object with a method")
        if method != "reload_weights":
            return error(400, f"the simulator runs only reload_weights, not {method!r}")
        await controller.reload_weights()
        return web.json_response({"results": [None]})

    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_post("/collective_rpc", collective_rpc)
