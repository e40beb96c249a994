"""Builders for agent tests: a virtual clock, fake engines and a fake spawner."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx

from agent.engine_client import Health
from agent.node import Agent, AgentOptions
from tests.support.stacks import pool


class VirtualClock:
    """Monotonic and wall time that only move when someone sleeps: supervisor tests run instantly."""

    def __init__(self, wall0: float = 1_790_000_000.0) -> None:
        self.now = 1000.0
        self.wall0 = wall0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.wall0 + self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)


class FakeEngine:
    """An engine process: exits when killed, and on SIGTERM unless ``ignores_sigterm``; with ``exits_after_s`` (and
    the clock) it takes that long after the SIGTERM to exit, as an idle vLLM tears down."""

    def __init__(
        self,
        pid: int,
        ignores_sigterm: bool = False,
        clock: VirtualClock | None = None,
        exits_after_s: float | None = None,
    ) -> None:
        self.pid = pid
        self._returncode: int | None = None
        self.ignores_sigterm = ignores_sigterm
        self.terminated_at: float | None = None
        self.killed = False
        self._exited = asyncio.Event()
        self._clock, self._exits_after_s = clock, exits_after_s
        self._exit_at: float | None = None

    @property
    def returncode(self) -> int | None:
        if self._exit_at is not None and self._clock is not None and self._clock.now >= self._exit_at:
            self.exit(0)
        return self._returncode

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._returncode is not None
        return self._returncode

    def exit(self, code: int) -> None:
        if self._returncode is None:
            self._returncode = code
            self._exited.set()

    def terminate(self) -> None:
        self.terminated_at = self.terminated_at or -1.0
        if self._exits_after_s is not None and self._clock is not None:
            self._exit_at = self._clock.now + self._exits_after_s
        elif not self.ignores_sigterm:
            self.exit(0)

    def kill(self) -> None:
        self.killed = True
        self.exit(-9)


@dataclass
class FakeWorld:
    """A spawner plus an engine client whose answers follow the current fake engine and the virtual clock."""

    clock: VirtualClock
    startup_s: float = 2.0
    warm_ok: bool = True
    healthy: bool = True
    crash_on_start: bool = False
    ignores_sigterm: bool = False
    exits_after_s: float | None = None  # after a SIGTERM, the engine exits this long later (on the world's clock)
    in_flight: float = 0.0
    engines: list[FakeEngine] = field(default_factory=list)
    spawned_at: list[float] = field(default_factory=list)
    warmups: int = 0
    asleep: bool = False
    sleep_ok: bool = True
    wake_changes_tokens: bool = False  # after a wake the check answers other text
    sleeps: int = 0
    wakes: int = 0
    weights: int = 0  # which weights the engine holds: the check's answer depends on them

    @property
    def engine(self) -> FakeEngine | None:
        return self.engines[-1] if self.engines else None

    async def spawn(self) -> FakeEngine:
        engine = FakeEngine(100 + len(self.engines), self.ignores_sigterm, self.clock, self.exits_after_s)
        self.engines.append(engine)
        self.spawned_at.append(self.clock.now)
        if self.crash_on_start:
            engine.exit(1)
        return engine

    def _listening(self) -> bool:
        engine = self.engine
        return (
            engine is not None and engine.returncode is None and self.clock.now - self.spawned_at[-1] >= self.startup_s
        )

    async def health(self) -> Health:
        if not self._listening():
            return Health.REFUSED
        return Health.OK if self.healthy else Health.UNHEALTHY

    async def warm_up(self) -> bool:
        self.warmups += 1
        return self._listening() and self.warm_ok

    async def metrics(self) -> str:
        if not self._listening():
            raise ConnectionError("refused")
        return (
            f"vllm:num_requests_running {self.in_flight}\nvllm:num_requests_waiting 0\n"
            "vllm:kv_cache_usage_perc 0.1\nvllm:num_preemptions_total 0\n"
            "vllm:prompt_tokens_total 0\nvllm:generation_tokens_total 0\n"
        )

    async def version(self) -> str | None:
        return "sim-test"

    async def sleep(self, level: int) -> bool:
        assert level == 1
        self.sleeps += 1
        self.asleep = self._listening() and self.sleep_ok
        return self.asleep

    async def wake_up(self) -> bool:
        self.wakes += 1
        if not self._listening():
            return False
        self.asleep = False
        self.weights += 1 if self.wake_changes_tokens else 0
        return True

    async def check(self) -> str | None:
        if not self._listening() or self.asleep:
            return None
        return f"Paris, with weights {self.weights}"


def api_agent(http: httpx.AsyncClient, clock: VirtualClock | None = None, replica: str = "r0") -> Agent:
    """A real `Agent` whose supervisor never runs: its API answers from the state tests drive by hand, and a drain
    only flips that state (no engine is ever spawned, nothing exits). ``http`` is never used."""
    options = AgentOptions(replica=replica, port=1, engine_port=2, control_plane=None)
    return Agent(pool(), options, http, clock or VirtualClock())
