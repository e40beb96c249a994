"""Replica: one simulated engine replica: its scheduler, its state and what its agent last scraped from it.

``launching -> ready -> draining -> stopped``: a launched replica becomes ready ``coldStartSeconds`` later; one chosen
to go stops taking traffic at once (draining) and stops when its last request finishes. Sleep mode adds
``ready -> draining -> sleeping -> waking -> ready``: one chosen to sleep drains the same way, then sleeps (its
scheduler is replaced by a fresh one: a level-1 sleep discards the KV cache and the prefix cache with it), and
wakes when a scale-up asks. `Replica.scrape` is what
the agent's metrics scrape sees every ``SCRAPE_S``; `Replica.load` is that as the control loop's report.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

from agent.engine_client import CHECK_MAX_TOKENS
from control_plane.scaling.context import ReplicaLoad
from engine_sim.config import EngineConfig
from engine_sim.scheduler import Scheduler, StepPlan
from engine_sim.sleep import WakeTiming
from fleet.capacity.perf import StepTimeModel
from fleet.protocol.wire import ReplicaState
from gateway.routing.base import EndpointView, expected_prefill
from simulate.result import quantile

__all__ = ["SCRAPE_S", "TTFT_WINDOW_S", "Replica", "wake_seconds"]

SCRAPE_S = 1.0  # agents and gateways scrape engine metrics about once a second
TTFT_WINDOW_S = 30.0  # the agent's TTFT P99 window
# states whose agent reports no load: not started yet, or asleep (its last scrape is from before the sleep)
_UNMEASURED = frozenset({ReplicaState.LAUNCHING, ReplicaState.SLEEPING, ReplicaState.WAKING})


@dataclass
class Replica:
    name: str
    scheduler: Scheduler
    launched_at: float
    state: ReplicaState = ReplicaState.LAUNCHING  # launching -> ready -> draining -> stopped
    stopped_at: float | None = None
    plan: StepPlan | None = None
    run_seq: int = 0  # the scheduler's current decode run's event carries this; an older one is stale
    in_flight: int = 0
    # the gateway's own count of its open requests here, in prompt tokens (`EndpointView.prefill_tokens`,
    # ``context_tokens``): per request, (tokens it expects this replica to prefill, prompt tokens, answered yet)
    open: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    prefill_tokens: int = 0
    context_tokens: int = 0
    # the last scrape: (running, waiting, kv_usage, ttft_p99_s, tokens_per_s), taken at ``scraped_at``
    scraped: tuple[float, float, float, float | None, float] = (0.0, 0.0, 0.0, None, 0.0)
    scraped_at: float | None = None
    gen_tokens_at_scrape: int = 0
    ttfts: deque[tuple[float, float]] = field(default_factory=deque)
    to_sleep: bool = False  # draining to sleep (sleep mode), not to stop
    # what the schedulers a sleep replaced had done: (busy seconds, preemptions)
    done_before: tuple[float, int] = (0.0, 0)

    @property
    def busy_s(self) -> float:
        return self.done_before[0] + self.scheduler.stats.busy_seconds

    @property
    def preemptions(self) -> int:
        return self.done_before[1] + self.scheduler.stats.preemptions

    def sent(self, rid: str, prompt_tokens: int, spared: float) -> None:
        """The gateway sent request ``rid`` here, expecting the cache to hold ``spared`` of its prompt."""
        uncached = expected_prefill(prompt_tokens, spared)
        self.open[rid] = (uncached, prompt_tokens, False)
        self.in_flight += 1
        self.prefill_tokens += uncached

    def answered(self, rid: str) -> None:
        """Request ``rid``'s first token reached the gateway: its prompt is prefilled, its context decodes."""
        uncached, tokens, _ = self.open[rid]
        self.open[rid] = (uncached, tokens, True)
        self.prefill_tokens -= uncached
        self.context_tokens += tokens

    def finished(self, rid: str) -> None:
        uncached, tokens, answered = self.open.pop(rid)
        self.in_flight -= 1
        if answered:
            self.context_tokens -= tokens
        else:
            self.prefill_tokens -= uncached

    def fall_asleep(self, fresh: Scheduler) -> None:
        """Sleep (level 1): KV cache discarded, so the scheduler is ``fresh``; the old one's work is kept."""
        self.done_before = (self.busy_s, self.preemptions)
        self.scheduler, self.plan, self.to_sleep = fresh, None, False
        self.state = ReplicaState.SLEEPING

    def scrape(self, now: float, itls: array[float]) -> None:
        """Take this scrape's figures at ``now``; an open decode run first applies the steps ended by then, whose
        inter-token latencies go to ``itls``."""
        sched = self.scheduler
        if sched.in_run:  # what single steps would have done by now
            add_itls(itls, sched.advance_decode_run(now))
        while self.ttfts and now - self.ttfts[0][0] > TTFT_WINDOW_S:
            self.ttfts.popleft()
        p99 = quantile(sorted(v for _, v in self.ttfts), 0.99) if self.ttfts else None
        gen = sched.stats.generation_tokens
        tps = (gen - self.gen_tokens_at_scrape) / SCRAPE_S
        self.gen_tokens_at_scrape = gen
        self.scraped = (float(sched.num_running), float(sched.num_waiting), sched.kv_usage, p99, tps)
        self.scraped_at = now

    def view(self, pool: str, model: str, max_num_seqs: int, now: float) -> EndpointView:
        """This replica as the gateway's routing sees it at ``now``: its last scrape and the live in-flight count."""
        running, waiting, kv, _, _ = self.scraped
        return EndpointView(
            id=self.name,
            url=f"sim://{self.name}",
            pool=pool,
            model=model,
            ready=self.state == ReplicaState.READY,
            ejected=False,
            metrics_age_s=None if self.scraped_at is None else now - self.scraped_at,
            running=running,
            waiting=waiting,
            kv_usage=kv,
            in_flight=self.in_flight,
            max_num_seqs=max_num_seqs,
            prefill_tokens=self.prefill_tokens,
            context_tokens=self.context_tokens,
        )

    def load(self, now: float) -> ReplicaLoad:
        """The agent's report of this replica at ``now`` (state only until its first scrape)."""
        if self.state in _UNMEASURED or self.scraped_at is None:
            return ReplicaLoad(self.name, self.state)
        running, waiting, kv, p99, tps = self.scraped
        return ReplicaLoad(self.name, self.state, False, waiting, running, kv, p99, tps, now - self.scraped_at)


def add_itls(out: array[float], itls: list[tuple[float, int]]) -> None:
    """Append each ``(latency, count)`` of a decode run's steps to ``out``, ``count`` times."""
    for latency, count in itls:
        out.extend(array("d", [latency]) * count)


def wake_seconds(config: EngineConfig) -> float:
    """A sleeping replica's wake until it serves: the simulated engine's wake (`engine_sim.sleep.WakeTiming`: the
    weights over host-to-device bandwidth plus its fixed part) and the agent's greedy check after it
    (``CHECK_MAX_TOKENS`` decode steps of one sequence)."""
    steps = StepTimeModel.for_names(config.facts, config.gpu_profile, config.tensor_parallel_size)
    check_s = CHECK_MAX_TOKENS / steps.decode_tokens_per_s(1, context=CHECK_MAX_TOKENS)
    return WakeTiming.for_config(config).move_s(copies_weights=True) + check_s
