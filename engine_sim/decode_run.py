"""DecodeRun: many pure-decode steps planned at once, for a discrete-event simulator.

While nothing waits and every running request decodes, each step gives every request one token and only the
step's context grows, so the steps up to the first finish are known in advance: their times from the batch
size and the summed context, their KV calls from each request's block boundaries. A run applies them in
aggregate (tokens, counters, KV calls in single-step order) instead of building every step and token; the
state after any applied prefix is the state single steps leave. Token events are not built: the ITLs come
back as (latency, count) pairs. The live engine does not use runs; `Scheduler.start_decode_run` opens one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from engine_sim.kv import KVCacheManager
from engine_sim.request import SimRequest
from engine_sim.timing import StepTimer, StepWork

__all__ = ["DecodeRun", "KvOp", "RunCounters"]


class KvOp(NamedTuple):
    """One KV call of a run's steps: ``alloc`` grows the blocks of request ``request_index`` (in the run) before
    step ``step`` starts, ``cache`` publishes the block that step fills. Ops sort in single-step order: by step,
    allocations before caching ("alloc" < "cache"), then by request."""

    step: int
    kind: Literal["alloc", "cache"]
    request_index: int


class RunCounters(Protocol):
    """The scheduler's counters a run advances (`engine_sim.scheduler.SchedulerStats`)."""

    steps: int
    busy_seconds: float
    generation_tokens: int


@dataclass
class DecodeRun:
    """Steps planned at once: step ``j`` ends at ``ends[j]``; the first ``done`` are applied.

    ``kv_ops`` are the steps' KV calls in single-step order, the first ``ops_done`` made; ``computed[i]`` is
    request ``i``'s computed tokens when the run began.
    """

    requests: tuple[SimRequest, ...]
    computed: tuple[int, ...]
    durations: list[float]
    ends: list[float]
    kv_ops: list[KvOp]
    done: int = 0
    ops_done: int = 0

    @classmethod
    def plan(
        cls,
        running: Sequence[SimRequest],
        kv: KVCacheManager,
        timer: StepTimer,
        now: float,
        max_steps: int,
        *,
        max_model_len: int,
        started_at: float,
    ) -> DecodeRun | None:
        """Up to ``max_steps`` pure-decode steps of ``running`` from ``now``; None when the next step is not such
        a step (a request prefills or finishes next, jitter draws per step) or fewer than two would run. The
        caller rules out what it alone knows: a request waiting, a budget smaller than the batch."""
        if not running or timer.jitter:
            return None
        steps, context = max_steps, 0
        for r in running:
            num_tokens, num_prompt = len(r.token_ids), len(r.prompt_token_ids)
            if num_tokens - r.num_computed_tokens != 1 or num_tokens <= num_prompt:
                return None  # not a decode
            n_out = num_tokens - num_prompt
            left = min(r.max_tokens - n_out, max_model_len - num_tokens)
            if r.stop_after is not None:
                left = min(left, r.stop_after - n_out)
            steps = min(steps, left - 1)  # step ``left - 1`` samples its last token: the run stops before it
            context += num_tokens
        if steps < 2:
            return None
        ops = _kv_ops(running, kv.block_size, steps)
        allocs = [op.step for op in ops if op.kind == "alloc"]
        if len(allocs) > kv.pool.num_free:  # each call takes at most one block: stop before one could fail
            steps = allocs[kv.pool.num_free]
            ops = [op for op in ops if op.step < steps]
            if steps < 2:
                return None
        n = len(running)
        durations: list[float] = []
        ends: list[float] = []
        start = now
        for j in range(steps):
            duration = timer.seconds(StepWork(n, context + j * n, 0.0), uptime_s=start - started_at, num_seqs=n)
            start += duration
            durations.append(duration)
            ends.append(start)
        return cls(tuple(running), tuple(r.num_computed_tokens for r in running), durations, ends, ops)

    def steps_ended_by(self, now: float) -> int:
        """How many steps ended before ``now``; a step ending at ``now`` is still running, as for an event."""
        return bisect.bisect_left(self.ends, now)

    def truncate(self, now: float) -> float:
        """End the run with the step running at ``now``; its end."""
        last = min(self.steps_ended_by(now), len(self.ends) - 1)
        del self.ends[last + 1 :], self.durations[last + 1 :]
        self.kv_ops = [op for op in self.kv_ops if op.step <= last]
        return self.ends[-1]

    def apply(self, upto: int, kv: KVCacheManager, stats: RunCounters) -> list[tuple[float, int]]:
        """Apply the steps before step ``upto``; their ITLs as (latency, count) pairs."""
        first, count = self.done, upto - self.done
        requests, ends, n = self.requests, self.ends, len(self.requests)
        itls: list[tuple[float, int]] = []
        if count > 0:
            stats.steps += count
            for duration in self.durations[first:upto]:  # one by one: the same float sum as single steps
                stats.busy_seconds += duration
            stats.generation_tokens += n * count
            for r in requests:
                itls.append((ends[first] - (r.last_token_time or ends[first]), 1))
                r.token_ids += r.filler_ids(len(r.token_ids), count)
                r.num_computed_tokens += count
                r.last_token_time = ends[upto - 1]
            itls += [(ends[j] - ends[j - 1], n) for j in range(first + 1, upto)]
            self.done = upto
        self._apply_kv(upto, kv)
        return itls

    def _apply_kv(self, upto: int, kv: KVCacheManager) -> None:
        # The KV calls after the tokens (caching hashes only computed blocks, which the new tokens don't change),
        # up to the allocations of the step running now: a step takes its blocks when it starts.
        ops, requests = self.kv_ops, self.requests
        running_now = upto if upto < len(self.ends) else -1
        while self.ops_done < len(ops):
            j, kind, i = ops[self.ops_done]
            if j >= upto and not (j == running_now and kind == "alloc"):
                break
            self.ops_done += 1
            r = requests[i]
            if kind == "alloc":
                if not kv.allocate_slots(r.request_id, self.computed[i] + j + 1):
                    raise RuntimeError("a decode run ran out of KV blocks")  # `plan` rules this out
            else:
                kv.cache_computed(r.request_id, r.token_ids, self.computed[i] + j + 1)


def _kv_ops(running: Sequence[SimRequest], block_size: int, steps: int) -> list[KvOp]:
    """The KV calls of ``steps`` decode steps, sorted into single-step order."""
    ops: list[KvOp] = []
    for i, r in enumerate(running):
        c = r.num_computed_tokens
        # Single steps call allocate_slots when the computed tokens end a block, cache_computed when the step
        # fills one (`Scheduler.schedule` and `complete` skip both otherwise).
        ops += [KvOp(j, "alloc", i) for j in range(-c % block_size, steps, block_size)]
        ops += [KvOp(j, "cache", i) for j in range(-(c + 1) % block_size, steps, block_size)]
    ops.sort()
    return ops
