"""Engine: the asyncio real-time driver of one `Scheduler`, and the per-request token streams it feeds.

The driver loop plans a step on the model clock, sleeps until that step's end in wall time
(``model seconds / time_scale``), completes it and hands the sampled tokens to each request's `TokenStream`.
Steps are paced against absolute deadlines, so coarse sleeps do not accumulate drift. When the host falls
more than ``max_lag_s`` (wall) behind the model clock, the driver resynchronises and counts the skipped model
time in ``llmfleet_sim_behind_seconds_total``: a bench reads it to find how many streams one process sustains.

States: ``serving`` -> ``draining`` (SIGTERM with a timeout: in-flight requests continue, new ones are
refused) -> ``stopped``; any state -> ``dead`` (crash fault: streams fail, ``/health`` turns 503). Apart from
the state, `pause` stops the loop from stepping (sleep mode, `engine_sim.sleep`): requests still queue, and
`resume` lets them run.

KV events (``--kv-events-config``): after each step the engine takes the events the block pool recorded during it
and, when there are any, hands them to ``on_kv_events`` with the wall time, as vLLM's scheduler publishes one batch
per step that produced events. An idle engine publishes nothing: events recorded between steps (a prefix-cache
reset, a sleep) go out with the next step's batch.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

from engine_sim.config import EngineConfig, build_scheduler
from engine_sim.errors import RequestError
from engine_sim.kv_events import KVEvent
from engine_sim.lora import AdapterResidency
from engine_sim.metrics import EngineMetricsRecorder
from engine_sim.request import FinishReason, SimRequest
from engine_sim.scheduler import Scheduler, StepResult
from fleet.protocol.clock import Clock, SystemClock

__all__ = ["Engine", "EngineState", "TokenStream", "collect"]

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
DRAINING_MESSAGE = "cannot schedule new futures after shutdown"  # vLLM's answer to a request after SIGTERM


class EngineState(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"
    DEAD = "dead"


class TokenStream:
    """Tokens of one request as the engine produces them; one consumer awaits `next_batch`."""

    __slots__ = ("request", "_pending", "_event", "finished", "error")

    def __init__(self, request: SimRequest) -> None:
        self.request = request
        self._pending: list[int] = []
        self._event = asyncio.Event()
        self.finished: FinishReason | None = None
        self.error: str | None = None

    def push(self, token_id: int, finished: FinishReason | None) -> None:
        self._pending.append(token_id)
        if finished is not None:
            self.finished = finished
        self._event.set()

    def close(self, reason: FinishReason, error: str | None = None) -> None:
        self.finished = reason
        self.error = error
        self._event.set()

    async def next_batch(self) -> tuple[list[int], FinishReason | None]:
        """Tokens produced since the last call (maybe several steps' worth) and the finish reason if done."""
        while not self._pending and self.finished is None:
            self._event.clear()
            await self._event.wait()
        tokens, self._pending = self._pending, []
        return tokens, self.finished


async def collect(stream: TokenStream) -> tuple[list[int], str]:
    """Every token of ``stream`` and its finish reason, once it finished (``stream.error`` says if it failed)."""
    tokens: list[int] = []
    while True:
        batch, finish = await stream.next_batch()
        tokens.extend(batch)
        if finish is not None:
            return tokens, finish.value


class Engine:
    """One simulated replica: scheduler + metrics + the real-time loop. Start with `start`, stop with `stop`."""

    def __init__(
        self,
        config: EngineConfig,
        time_scale: float = 1.0,
        clock: Clock | None = None,
        max_lag_s: float = 0.05,
    ) -> None:
        """``clock`` (default the process's) paces the loop: model time is its monotonic seconds since
        construction times ``time_scale``."""
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.config = config
        self.time_scale = time_scale
        self._clock = clock or SystemClock()
        self._t0 = self._clock.monotonic()
        self.max_lag_s = max_lag_s
        self.scheduler: Scheduler = build_scheduler(config, started_at=0.0)
        pool = self.scheduler.kv.pool
        self.metrics = EngineMetricsRecorder(
            config.served_model_name,
            config.max_model_len,
            {
                "block_size": str(self.scheduler.kv.block_size),
                "cache_dtype": "auto",
                "enable_prefix_caching": str(config.enable_prefix_caching),
                "gpu_memory_utilization": str(config.gpu_memory_utilization),
                "num_gpu_blocks": str(pool.num_blocks),
                "num_gpu_blocks_override": str(config.num_gpu_blocks_override),
                "prefix_caching_hash_algo": "sha256",
            },
        )
        self.state = EngineState.SERVING
        self.streams: dict[str, TokenStream] = {}
        self.on_token: Callable[[TokenStream], None] | None = None  # fault hook, called per pushed token
        self.on_kv_events: Callable[[float, list[KVEvent]], None] | None = None  # (wall time, one step's events)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self.paused = False
        self._plan_end = 0.0
        self.behind_seconds = 0.0
        self.adapters = AdapterResidency(config.lora, config.facts) if config.lora is not None else None
        self.adapter_of: dict[str, str] = {}  # request id -> the LoRA adapter it uses

    # -- clock ---------------------------------------------------------------------------------------------
    @property
    def clock(self) -> Clock:
        """The clock that paces the loop (wall seconds; model seconds are these times ``time_scale``)."""
        return self._clock

    def _wall_model(self) -> float:
        return (self._clock.monotonic() - self._t0) * self.time_scale

    def now(self) -> float:
        """The model clock: wall-derived, but never past the end of the step in flight."""
        wall = self._wall_model()
        return min(wall, self._plan_end) if self._busy else wall

    # -- requests ------------------------------------------------------------------------------------------
    async def adapter_ready(self, name: str) -> float:
        """Wait (in model time) until LoRA adapter ``name`` is on the GPU; returns the model time the request
        arrived, for `submit`, so the wait counts in its TTFT."""
        arrived = self.now()
        assert self.adapters is not None
        wait = self.adapters.ready_in(name, arrived)
        if wait > 0:
            await self._clock.sleep(wait / self.time_scale)
        return arrived

    def submit(self, request: SimRequest, *, arrived: float | None = None, adapter: str | None = None) -> TokenStream:
        """Queue a request (that arrived at model time ``arrived``, default now); RequestError(500) when draining
        or dead, (400) when it cannot fit. Draining answers what vLLM does (0.32 measured, 0.33 the same code): its
        SIGTERM handler shuts the renderer's thread pool first, so a new request fails with that pool's error."""
        if self.state is EngineState.DEAD:
            raise RequestError(500, ENGINE_DEAD_MESSAGE, "InternalServerError")
        if self.state is not EngineState.SERVING:
            raise RequestError(500, DRAINING_MESSAGE, "InternalServerError")
        try:
            self.scheduler.add(request, self.now() if arrived is None else arrived)
        except ValueError as exc:
            raise RequestError(400, str(exc)) from None
        if adapter is not None:
            self.adapter_of[request.request_id] = adapter
        stream = TokenStream(request)
        self.streams[request.request_id] = stream
        self._idle.clear()
        self._wake.set()
        self._observe(None)
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (client gone): frees its blocks at once; no-op when already finished."""
        stream = self.streams.pop(request_id, None)
        self.adapter_of.pop(request_id, None)
        request = self.scheduler.abort(request_id, self.now())
        if request is not None:
            self.metrics.on_finished(request)
            self._observe(None)
        if stream is not None:
            stream.close(FinishReason.ABORT)
        self._check_idle()

    def release_held(self, request_id: str) -> None:
        """Free the blocks a finished prefill leg held for a remote decode (`engine_sim.nixl`)."""
        if self.scheduler.release_held(request_id):
            self._observe(None)

    def abort_all(self) -> None:
        for request_id in list(self.streams):
            self.abort(request_id)

    def kill(self, reason: str = ENGINE_DEAD_MESSAGE) -> None:
        """Crash: every in-flight request fails and new ones get 500; ``/health`` reports 503."""
        self.state = EngineState.DEAD
        for request in self.scheduler.abort_all(self.now()):
            request.finish_reason = FinishReason.ERROR
            self.metrics.on_finished(request)
        for stream in self.streams.values():
            stream.close(FinishReason.ERROR, reason)
        self.streams.clear()
        self._observe(None)
        self._check_idle()

    def begin_drain(self) -> None:
        if self.state is EngineState.SERVING:
            self.state = EngineState.DRAINING

    def pause(self) -> None:
        """Take no step from the next one on; submitted requests wait in the scheduler's queue."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    def reset_prefix_cache(self) -> None:
        self.scheduler.kv.pool.reset_prefix_cache()

    def try_reset_prefix_cache(self) -> bool:
        """``POST /reset_prefix_cache``: reset only when no request holds a block (vLLM's rule); whether it did."""
        pool = self.scheduler.kv.pool
        if pool.num_free < pool.num_blocks:
            return False
        pool.reset_prefix_cache()
        return True

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def _check_idle(self) -> None:
        if not self.streams and not self.scheduler.has_work():
            self._idle.set()

    # -- loop ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self.state is not EngineState.DEAD:
            self.state = EngineState.STOPPED
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        sched = self.scheduler
        model_now = 0.0
        while True:
            if not sched.has_work() or self.state is EngineState.DEAD or self.paused:
                self._busy = False
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._busy:
                model_now, self._busy = self._wall_model(), True
            plan = sched.schedule(model_now)
            if plan is None:  # nothing schedulable until something finishes or is aborted
                self._busy = False
                self._wake.clear()
                await self._wake.wait()
                continue
            self._plan_end = plan.end
            await self._clock.sleep(plan.end / self.time_scale + self._t0 - self._clock.monotonic())
            self._dispatch(sched.complete(plan))
            self._publish_kv_events()
            model_now = plan.end
            lag = self._wall_model() - model_now
            if lag > self.max_lag_s * self.time_scale:
                self.behind_seconds += lag
                self.metrics.on_behind(lag)
                model_now = self._wall_model()

    def _publish_kv_events(self) -> None:
        log = self.scheduler.kv.pool.events
        if log is None:
            return
        events = log.take()
        if events and self.on_kv_events is not None:
            self.on_kv_events(self._clock.time(), events)

    def _observe(self, result: StepResult | None) -> None:
        self.metrics.on_step(result, self.scheduler)
        if self.adapters is not None:
            of = self.adapter_of
            running = {of[r.request_id] for r in self.scheduler.running if r.request_id in of}
            waiting = {of[r.request_id] for r in self.scheduler.waiting if r.request_id in of}
            self.metrics.on_lora(self.adapters.settings.max_loras, running, waiting)

    def _dispatch(self, result: StepResult) -> None:
        streams, hook = self.streams, self.on_token
        for event in result.events:
            stream = streams.get(event.request.request_id)
            if event.finished is not None:
                self.metrics.on_finished(event.request)
                streams.pop(event.request.request_id, None)
                self.adapter_of.pop(event.request.request_id, None)
            if stream is not None:
                stream.push(event.token_id, event.finished)
                if hook is not None:
                    hook(stream)
        self._observe(result)
        self._check_idle()
