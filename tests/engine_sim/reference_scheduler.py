"""ReferenceScheduler: the scheduler's step written the plain way, as an oracle for the optimised one.

`Scheduler.schedule` and `complete` skip the KV calls for a step that stays inside a request's last block, sum
the step's work as they go, read generated ids a chunk at a time and count tokens once per step. This subclass
does each thing per request and per token, as the rule reads in `engine_sim.scheduler`'s module docstring:
every running request asks the KV manager for its slots and to cache its computed blocks on every step, the
work is summed in a second pass and every token calls `filler_ids`. Tests hold the two to the same steps.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_sim.request import FinishReason, RequestStatus, SimRequest
from engine_sim.scheduler import Scheduler, StepPlan, StepResult, TokenEvent
from engine_sim.timing import StepWork
from engine_sim.tokenizer import filler_ids

__all__ = ["ReferenceScheduler"]


class ReferenceScheduler(Scheduler):
    def schedule(self, now: float) -> StepPlan | None:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._chunk(request.num_tokens - request.num_computed_tokens, budget)
            while not self.kv.allocate_slots(request.request_id, request.num_computed_tokens + num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break
            scheduled.append((request, num_new))
            budget -= num_new
            i += 1
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hits, hit_tokens = self.kv.computed_blocks(request.request_id, request.token_ids)
            num_new = self._chunk(request.num_tokens - hit_tokens, budget)
            if not self.kv.allocate_slots(request.request_id, hit_tokens + num_new, hits):
                break
            self.waiting.popleft()
            self.stats.prefix_queries += request.num_tokens
            self.stats.prefix_hits += hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = hit_tokens
            if request.scheduled_time is None:
                request.scheduled_time = now
            request.num_computed_tokens = hit_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append((request, num_new))
            budget -= num_new
        if not scheduled:
            return None
        work = _work_of(scheduled)
        duration = self.timer.seconds(work, uptime_s=now - self.started_at)
        return StepPlan(now, duration, tuple(scheduled), work, tuple(preempted))

    def complete(self, plan: StepPlan) -> StepResult:
        now = plan.end
        self.stats.steps += 1
        self.stats.busy_seconds += plan.duration
        events: list[TokenEvent] = []
        for request, num_new in plan.scheduled:
            if request.status is not RequestStatus.RUNNING:
                continue
            request.num_computed_tokens += num_new
            self.kv.cache_computed(request.request_id, request.token_ids, request.num_computed_tokens)
            if request.num_computed_tokens < request.num_tokens:
                continue
            (token,) = filler_ids(request.output_seed, request.num_tokens, 1)
            request.token_ids.append(token)
            first = request.first_token_time is None
            if first:
                request.first_token_time = now
                self.stats.prompt_tokens += request.num_prompt_tokens
            latency = now - (request.arrival_time if first else request.last_token_time or now)
            request.last_token_time = now
            self.stats.generation_tokens += 1
            reason = self._finish_reason(request)
            if reason is not None:
                self.running.remove(request)
                self._finish(request, reason, now)
            events.append(TokenEvent(request, token, reason, first, latency))
        return StepResult(plan, tuple(events))

    def _finish_reason(self, request: SimRequest) -> FinishReason | None:
        n_out = request.num_output_tokens
        if request.stop_after is not None and n_out >= request.stop_after:
            return FinishReason.STOP
        if n_out >= request.max_tokens or request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None


def _work_of(scheduled: Iterable[tuple[SimRequest, int]]) -> StepWork:
    tokens, decode_ctx, attn = 0, 0, 0.0
    for request, n in scheduled:
        tokens += n
        end = request.num_computed_tokens + n
        if n == 1 and end == request.num_tokens and request.num_output_tokens > 0:
            decode_ctx += end
        else:
            attn += float(n) * end
    return StepWork(tokens, decode_ctx, attn)
