"""Scheduler: vLLM V1's continuous-batching step loop as a pure object on an injected clock.

One step, as in ``vllm/v1/core/sched/scheduler.py``:

1. RUNNING requests in order each get ``min(uncomputed tokens, remaining budget)`` tokens (1 for a decode, a
   chunk for an unfinished prefill). When the KV cache cannot hold them, the *last* running request is
   preempted (recompute: blocks freed, progress reset, put at the front of WAITING), repeatedly, until the
   allocation fits or the request preempted itself.
2. Only if nothing was preempted, WAITING requests (FCFS) are admitted while budget and ``max_num_seqs``
   allow: the prefix cache supplies their longest cached prefix, the rest is prefilled in chunks.
3. When a request's computed tokens catch up with its tokens, it samples one output token.

P/D (`engine_sim.nixl`): a decode leg's ``remote_tokens`` count as computed when it is first admitted (vLLM's
external tokens: no prefill work, the last prompt token recomputed), and a length-capped prefill leg with
``kv_hold`` keeps its blocks in ``held`` after it finishes, until `Scheduler.release_held`.

The object never reads a clock or sleeps: ``schedule(now)`` returns a `StepPlan` with the step's duration
and ``complete(plan)`` applies it at ``plan.end``. A real-time driver sleeps in between; a discrete-event
simulator just adds the duration. ``abort`` may be called between the two and frees blocks at once. A
discrete-event simulator may also take many pure-decode steps at once (``start_decode_run``, planned and
applied by `engine_sim.decode_run`), with the same outcome as single steps. Requests are
`engine_sim.request.SimRequest`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from engine_sim.decode_run import DecodeRun
from engine_sim.kv import Block, KVCacheManager
from engine_sim.request import FinishReason, RequestStatus, SimRequest
from engine_sim.timing import StepTimer, StepWork

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerStats", "StepPlan", "StepResult", "TokenEvent"]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # 0: a single request may take the whole budget


@dataclass
class SchedulerStats:
    """Cumulative counters, as vLLM's Prometheus counters count them (tokens, not requests, for the cache)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_seconds: float = 0.0


# The step's value types are named tuples: one is built per step or per sampled token, and a frozen dataclass
# costs twice as much to build; they are just as immutable.
class StepPlan(NamedTuple):
    start: float
    duration: float
    scheduled: tuple[tuple[SimRequest, int], ...]
    work: StepWork
    preempted: tuple[SimRequest, ...]

    @property
    def end(self) -> float:
        return self.start + self.duration


class TokenEvent(NamedTuple):
    """One sampled token; ``finished`` is set on the request's last token.

    ``latency`` is the time since arrival for the first token (TTFT), else since the previous token (ITL).
    """

    request: SimRequest
    token_id: int
    finished: FinishReason | None
    first: bool
    latency: float


class StepResult(NamedTuple):
    plan: StepPlan
    events: tuple[TokenEvent, ...]


class Scheduler:
    """Continuous batching over a `KVCacheManager`, timed by a `StepTimer`; ``started_at`` anchors uptime."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, timer: StepTimer, started_at: float = 0.0) -> None:
        self.config = config
        self.kv = kv
        self.timer = timer
        self.started_at = started_at
        self.stats = SchedulerStats()
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._requests: dict[str, SimRequest] = {}
        self._run: DecodeRun | None = None
        self.held: dict[str, list[Block]] = {}  # finished prefill legs' blocks, until `release_held`

    # -- queries ---------------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv.pool.usage

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def get(self, request_id: str) -> SimRequest | None:
        return self._requests.get(request_id)

    # -- inputs ----------------------------------------------------------------------------------------
    def add(self, request: SimRequest, now: float) -> None:
        """Queue a request; ValueError when it cannot fit ``max_model_len`` or has nothing to generate."""
        room = self.config.max_model_len - request.num_prompt_tokens
        if request.num_prompt_tokens < 1 or room < 1:
            raise ValueError(f"prompt of {request.num_prompt_tokens} tokens leaves no room to generate")
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id}")
        request.max_tokens = max(1, min(request.max_tokens, room))
        request.arrival_time = now
        request.status = RequestStatus.WAITING
        self._requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str, now: float) -> SimRequest | None:
        """Finish a request with ``abort`` and free its blocks; None when unknown or already finished."""
        request = self._requests.get(request_id)
        if request is None:
            return None
        if self._run is not None:
            raise RuntimeError("abort() during a decode run: finish it first")
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._finish(request, FinishReason.ABORT, now)
        return request

    def abort_all(self, now: float) -> list[SimRequest]:
        return [r for r in (self.abort(rid, now) for rid in list(self._requests)) if r is not None]

    # -- the step ----------------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        """Pick this step's tokens per request; None when there is nothing to run."""
        if self._run is not None:
            raise RuntimeError("schedule() during a decode run: finish it first")
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        budget, work = self._schedule_running(scheduled, preempted)
        if not preempted:
            work = self._admit_waiting(now, budget, scheduled, work)
        if not scheduled:
            return None
        duration = self.timer.seconds(work, uptime_s=now - self.started_at, num_seqs=len(scheduled))
        return StepPlan(now, duration, tuple(scheduled), work, tuple(preempted))

    # Both loops sum the step's work (`StepWork`) as they pick requests rather than in a second pass, running
    # requests first, then admitted ones: the same float sums in the same order as one pass over the step. A
    # request adds ``end`` to the decode context when it decodes (one new token, the last, after the prompt),
    # else ``num_new * end`` to the prefill attention.
    def _schedule_running(
        self, scheduled: list[tuple[SimRequest, int]], preempted: list[SimRequest]
    ) -> tuple[int, StepWork]:
        """Rule 1: the running requests' tokens, preempting from the back when the KV cache is full; the budget
        left and the work so far."""
        # Runs once per step for every running request, so attributes are read into locals and the long-prefill
        # threshold (`_chunk`) is applied inline: same rule, same order.
        budget = self.config.max_num_batched_tokens
        threshold = self.config.long_prefill_token_threshold
        kv, running, block_size = self.kv, self.running, self.kv.block_size
        tokens, decode_ctx, attn = 0, 0, 0.0
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            num_tokens = len(request.token_ids)
            num_new = num_tokens - computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            end = computed + num_new
            # A running request's blocks hold its computed tokens, so a step that ends in the block its computed
            # tokens end in needs no new block (allocate_slots would say yes at once): skip the call.
            fits = computed > 0 and (end - 1) // block_size == (computed - 1) // block_size
            while not fits and not kv.allocate_slots(request.request_id, end):
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break
            scheduled.append((request, num_new))
            tokens += num_new
            if num_new == 1 and end == num_tokens and num_tokens > len(request.prompt_token_ids):
                decode_ctx += end
            else:
                attn += float(num_new) * end
            budget -= num_new
            i += 1
        return budget, StepWork(tokens, decode_ctx, attn)

    def _admit_waiting(
        self, now: float, budget: int, scheduled: list[tuple[SimRequest, int]], work: StepWork
    ) -> StepWork:
        """Rule 2: admit waiting requests (FCFS) from their longest cached prefix while budget and seats allow;
        ``work`` grown by theirs."""
        kv, running = self.kv, self.running
        tokens, decode_ctx, attn = work
        while self.waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hits, hit_tokens = kv.computed_blocks(request.request_id, request.token_ids, request.cache_salt)
            external = self._external(request, hit_tokens)
            computed = hit_tokens + external
            num_new = self._chunk(request.num_tokens - computed, budget)
            if not kv.allocate_slots(request.request_id, computed + num_new, hits):
                break
            self.waiting.popleft()
            self.stats.prefix_queries += request.num_tokens
            self.stats.prefix_hits += hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = computed
                request.num_external_computed_tokens = external
            if request.scheduled_time is None:
                request.scheduled_time = now
            request.num_computed_tokens = computed
            if external:  # the pulled blocks are cached once loaded, as vLLM's scheduler caches them
                kv.cache_computed(request.request_id, request.token_ids, computed, request.cache_salt)
            request.status = RequestStatus.RUNNING
            running.append(request)
            scheduled.append((request, num_new))
            tokens += num_new
            end = computed + num_new
            if num_new == 1 and end == request.num_tokens and request.num_output_tokens > 0:
                decode_ctx += end
            else:
                attn += float(num_new) * end
            budget -= num_new
        return StepWork(tokens, decode_ctx, attn)

    def complete(self, plan: StepPlan) -> StepResult:
        """Apply a planned step at ``plan.end``: advance computed tokens, sample, finish, cache blocks."""
        now = plan.end
        stats, kv, running, block_size = self.stats, self.kv, self.running, self.kv.block_size
        stats.steps += 1
        stats.busy_seconds += plan.duration
        max_model_len = self.config.max_model_len
        events: list[TokenEvent] = []
        prompt_tokens = 0
        for request, num_new in plan.scheduled:
            if request.status is not RequestStatus.RUNNING:
                continue  # aborted or preempted while the step ran
            computed = request.num_computed_tokens + num_new
            request.num_computed_tokens = computed
            token_ids = request.token_ids
            if computed // block_size != (computed - num_new) // block_size:
                # A block became full. (Blocks that were full before this step were published when they filled,
                # or came from the cache, so otherwise `cache_computed` has nothing to do.)
                kv.cache_computed(request.request_id, token_ids, computed, request.cache_salt)
            num_tokens = len(token_ids)
            if computed < num_tokens:
                continue  # mid-prefill chunk: nothing sampled yet
            # The token's sequence position picks it (`filler_ids`), so sent-back text is continued seamlessly.
            token = request.filler_token(num_tokens)
            token_ids.append(token)
            first = request.first_token_time is None
            if first:
                request.first_token_time = now
                prompt_tokens += len(request.prompt_token_ids)
                latency = now - request.arrival_time
            else:
                latency = now - (request.last_token_time or now)
            request.last_token_time = now
            # `_finish_reason`, inlined: this runs for every token of every request.
            n_out = num_tokens + 1 - len(request.prompt_token_ids)
            reason: FinishReason | None = None
            if request.stop_after is not None and n_out >= request.stop_after:
                reason = FinishReason.STOP
            elif n_out >= request.max_tokens or num_tokens + 1 >= max_model_len:
                reason = FinishReason.LENGTH
            if reason is not None:
                running.remove(request)
                self._finish(request, reason, now)
            events.append(TokenEvent(request, token, reason, first, latency))
        stats.prompt_tokens += prompt_tokens
        stats.generation_tokens += len(events)
        return StepResult(plan, tuple(events))

    def step(self, now: float) -> StepResult | None:
        """Schedule and complete one step at once (virtual time)."""
        plan = self.schedule(now)
        return None if plan is None else self.complete(plan)

    # -- decode runs: many pure-decode steps at once, for a discrete-event simulator (`engine_sim.decode_run`) --
    @property
    def in_run(self) -> bool:
        return self._run is not None

    def start_decode_run(self, now: float, max_steps: int) -> float | None:
        """Plan up to ``max_steps`` pure-decode steps from ``now``; the last one's end, or None when the next step
        is not such a step (something waits, a request prefills or finishes next, jitter draws per step) or
        fewer than two would run. Until `finish_decode_run`, only the run's methods and `add` may be called."""
        if self._run is not None or self.waiting or len(self.running) > self.config.max_num_batched_tokens:
            return None
        run = DecodeRun.plan(
            self.running,
            self.kv,
            self.timer,
            now,
            max_steps,
            max_model_len=self.config.max_model_len,
            started_at=self.started_at,
        )
        if run is None:
            return None
        self._run = run
        return run.ends[-1]

    def advance_decode_run(self, now: float) -> list[tuple[float, int]]:
        """Apply the run's steps that ended before ``now``; their ITLs as (latency, count) pairs."""
        run = self._run
        if run is None:
            return []
        return run.apply(run.steps_ended_by(now), self.kv, self.stats)

    def truncate_decode_run(self, now: float) -> float:
        """End the run with the step running at ``now`` (a request arrived: the next step may admit it); its end."""
        if self._run is None:
            raise RuntimeError("no decode run")
        return self._run.truncate(now)

    def finish_decode_run(self) -> list[tuple[float, int]]:
        """Apply the rest of the run and end it; the ITLs as (latency, count) pairs."""
        run = self._run
        if run is None:
            return []
        out = run.apply(len(run.ends), self.kv, self.stats)
        self._run = None
        return out

    # -- helpers -----------------------------------------------------------------------------------------
    def _chunk(self, remaining: int, budget: int) -> int:
        """A prefill's tokens this step: at most the long-prefill threshold (when set) and the budget."""
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0 and remaining > threshold:
            remaining = threshold
        return min(remaining, budget)

    @staticmethod
    def _external(request: SimRequest, hit_tokens: int) -> int:
        """Prompt tokens a decode leg takes from its remote prefill beyond its local hit, on its first admission
        only (a preempted one recomputes: the prefill engine freed them). The last prompt token is always computed
        here, as vLLM recomputes it for its logits."""
        if not request.remote_tokens or request.num_preemptions:
            return 0
        return max(0, min(request.remote_tokens, request.num_tokens - 1) - hit_tokens)

    def release_held(self, request_id: str) -> bool:
        """Free the blocks a prefill leg held for a remote decode (pulled, or its lease over); False if none."""
        blocks = self.held.pop(request_id, None)
        if blocks is None:
            return False
        self.kv.pool.release(list(reversed(blocks)))
        return True

    def _preempt(self, request: SimRequest) -> None:
        self.kv.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(request)

    def _finish(self, request: SimRequest, reason: FinishReason, now: float) -> None:
        if request.kv_hold and reason is FinishReason.LENGTH:  # vLLM holds only a length-capped prefill leg's
            self.held[request.request_id] = self.kv.detach(request.request_id)
        else:
            self.kv.forget(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = now
        self._requests.pop(request.request_id, None)
