"""Chaos faults: the scenarios of `bench/chaos.py`, each a stack change and one coroutine that injects its fault.

A fault coroutine runs while the load is under way: it injects the fault, marks its time (`Ctx.mark`), waits for
the recovery the scenario is about where there is one (a replacement ready, a control plane listing replicas
again, both restarts done), lets the load run ``after_s`` more seconds, and leaves a note in words. It kills
only what the scenario's fleet started, by pid (an engine, an agent, Redis) or by process group (a component).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import yaml

from bench.chaos_harness import Fleet, Forwarder
from bench.chaos_load import Load
from control_plane.actuators.local_state import pid_alive
from fleet.protocol.control_auth import BearerAuth, ClientCredential, Kind

__all__ = ["Ctx", "Scenario", "scenarios", "stack_overrides"]


@dataclass
class Ctx:
    fleet: Fleet
    load: Load
    after_s: float
    forwarder: Forwarder | None = None
    notes: list[str] = field(default_factory=list)
    fault_at: float | None = None  # monotonic time of the fault

    def mark(self, wall: float | None = None) -> None:
        """The fault happens now, or happened at the wall-clock time ``wall`` (a control plane's record)."""
        self.fault_at = time.monotonic() - (0.0 if wall is None else max(0.0, time.time() - wall))


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    inject: Callable[[Ctx], Awaitable[None]]
    overrides: dict[str, Any] = field(default_factory=dict)
    gateways: int = 1
    redis: bool = False
    needs: str | None = None  # an executable the scenario needs
    model: str | None = None  # what the load asks for (None: the pool's served model)
    changes: str = ""  # the stack changes, in words


# -- the faults ------------------------------------------------------------------------------------------------
async def _victim(ctx: Ctx) -> tuple[str, dict[str, Any], int]:
    """The replica with the most streams under way: (replica, its agent's status, those streams)."""
    agents = ctx.fleet.agents()
    replica = max(agents, key=lambda a: len(ctx.load.streaming(a.replica)))
    status = await ctx.fleet.status(replica)
    return replica.replica, status, len(ctx.load.streaming(replica.replica))


async def engine_sigkill(ctx: Ctx) -> None:
    replica, status, streams = await _victim(ctx)
    os.kill(status["engine_pid"], signal.SIGKILL)
    ctx.mark()
    await asyncio.sleep(ctx.after_s)
    agent = next(a for a in ctx.fleet.agents() if a.replica == replica)
    after = await ctx.fleet.status(agent)
    ctx.notes.append(
        f"engine of {replica} SIGKILLed with {streams} streams under way on it; its agent {ctx.after_s:g} s later: "
        f"{after['restarts']} restart(s), state {after['state']}"
    )


async def engine_sigstop(ctx: Ctx) -> None:
    replica, status, streams = await _victim(ctx)
    pid = status["engine_pid"]
    first_token_s = ctx.fleet.document["config"]["llmfleet:gateway"]["timeouts"]["firstTokenS"]
    hang_s = first_token_s + 2.0
    os.kill(pid, signal.SIGSTOP)
    ctx.mark()
    await asyncio.sleep(hang_s)
    resumed_by = "SIGCONT"
    if pid_alive(pid):
        os.kill(pid, signal.SIGCONT)
    else:
        resumed_by = "nothing: the agent had already replaced it"
    await asyncio.sleep(ctx.after_s)
    agent = next(a for a in ctx.fleet.agents() if a.replica == replica)
    after = await ctx.fleet.status(agent)
    ctx.notes.append(
        f"engine of {replica} SIGSTOPped for {hang_s:g} s (first-token timeout {first_token_s:g} s) with {streams} "
        f"streams under way on it, then {resumed_by}; agent restarts {after['restarts']}, engine pid "
        f"{'unchanged' if after['engine_pid'] == pid else 'new'}"
    )


async def agent_sigkill(ctx: Ctx) -> None:
    victim = max(ctx.fleet.agents(), key=lambda a: len(ctx.load.streaming(a.replica)))
    status = await ctx.fleet.status(victim)
    streams = len(ctx.load.streaming(victim.replica))
    os.kill(victim.pid, signal.SIGKILL)  # the agent alone: its engine runs in a session of its own
    ctx.mark()
    started = time.monotonic()

    async def replaced() -> list[str] | None:
        listing = (await ctx.fleet.json("/v1/pools/qwen-7b/replicas"))["replicas"]
        others = [r["replica"] for r in listing if r["state"] == "ready" and not r["stale"]]
        return others if len(others) >= 2 and victim.replica not in others else None

    await ctx.fleet.until("a replacement replica ready", replaced, 60)
    replaced_s = time.monotonic() - started
    await asyncio.sleep(ctx.after_s)
    engine = status["engine_pid"]
    listing = (await ctx.fleet.json("/v1/pools/qwen-7b/replicas"))["replicas"]
    states = ", ".join(f"{r['replica']} {r['state']}{' (stale)' if r['stale'] else ''}" for r in listing)
    served = Counter(o.replica for o in ctx.load.outcomes if o.sent_at > started and o.replica)
    ctx.notes.append(
        f"agent of {victim.replica} SIGKILLed with {streams} streams under way on its engine; the engine "
        f"{'kept running, orphaned' if pid_alive(engine) else 'died'}; a replacement was ready {replaced_s:.1f} s "
        "after "
        f"the kill; requests sent after the kill served so far by {dict(served)}; replicas at the end: {states}"
    )


async def gateway_sigterm(ctx: Ctx) -> None:
    gateway = ctx.fleet.gateways[0]
    streams = len(ctx.load.streaming())
    in_flight = sum(1 for o in ctx.load.outcomes if o.ended_at is None)
    await ctx.fleet.scrape()
    ctx.load.stop()  # one gateway, no address behind it: nothing left to send to
    started = time.monotonic()
    gateway.child.process.send_signal(signal.SIGTERM)
    ctx.mark()
    code = await asyncio.to_thread(gateway.child.process.wait, 60)
    ctx.notes.append(
        f"SIGTERM with {in_flight} requests in flight ({streams} streaming) and sending stopped at the same moment; "
        f"the gateway exited {code} after {time.monotonic() - started:.1f} s"
    )


async def control_plane_sigkill(ctx: Ctx) -> None:
    assert ctx.fleet.control_plane is not None
    ctx.mark()
    await asyncio.to_thread(ctx.fleet.control_plane.kill)  # SIGKILL to its process group; agents have their own
    down_s = 2.0
    await asyncio.sleep(down_s)
    started = time.monotonic()
    ctx.fleet.start_control_plane()  # same port, same state dir

    async def listing() -> bool:
        return (await ctx.fleet.http.get(f"{ctx.fleet.cp_url}/v1/pools/qwen-7b/replicas")).status_code == 200

    await ctx.fleet.until("the restarted control plane listing replicas", listing, 30)
    listed_after = time.monotonic() - started
    await asyncio.sleep(ctx.after_s)
    ctx.notes.append(
        f"control plane SIGKILLed, down {down_s:g} s, restarted on its port and state dir; it listed replicas to "
        f"gateways again {listed_after:.1f} s after it was started; agents alive "
        f"{sum(pid_alive(a.pid) for a in ctx.fleet.agents())}/{len(ctx.fleet.agents())}"
    )


async def redis_sigkill(ctx: Ctx) -> None:
    fleet = ctx.fleet
    assert fleet.redis is not None
    fleet.redis.kill()
    ctx.mark()
    fleet.redis.wait(timeout=5)
    down_s = 3.0
    await asyncio.sleep(down_s)
    fleet.start_redis()
    await asyncio.sleep(ctx.after_s)
    await fleet.scrape()
    local = sum(g.quota_local for g in fleet.gateways)
    log = (fleet.logs / "gateway-0.log").read_text(errors="replace")
    ctx.notes.append(
        f"quota Redis SIGKILLed, down {down_s:g} s, restarted on its port (fail-open); {local:g} requests counted "
        f"locally meanwhile; gateway logged the outage: {'quota store down' in log}, the recovery: "
        f"{'quota store answers again' in log}"
    )


async def drain_long(ctx: Ctx) -> None:
    """A replica drained as a scale-down drains it (its agent's ``POST /drain``, the control plane's credential)
    while it streams answers longer than the drain leaves them: the engine's shutdown timeout cuts them and the
    gateway resumes each on the other replica."""
    fleet, load = ctx.fleet, ctx.load
    load.max_tokens, first_long = LONG_STREAM_TOKENS, len(load.outcomes)

    def long_on(replica: str) -> int:
        return sum(1 for o in load.streaming(replica) if o.index >= first_long)

    async def long_under_way() -> bool:
        return any(long_on(a.replica) >= 3 for a in fleet.agents())

    await fleet.until("three long streams under way on one replica", long_under_way, 60)
    replica = max((a.replica for a in fleet.agents()), key=long_on)
    streams = long_on(replica)
    agent = next(a for a in fleet.agents() if a.replica == replica)
    credential = ClientCredential.from_env(Kind.CONTROL_PLANE, fleet.env)
    assert credential is not None
    async with httpx.AsyncClient(timeout=5.0, auth=BearerAuth(credential)) as http:
        (await http.post(agent.url + "/drain")).raise_for_status()
    ctx.mark()
    started = time.monotonic()

    async def gone() -> bool:
        return not pid_alive(agent.pid)

    await fleet.until(f"{replica}'s agent to exit", gone, 30)
    drained_s = time.monotonic() - started
    await asyncio.sleep(ctx.after_s)
    ctx.notes.append(
        f"POST /drain to {replica} with {streams} streams of {LONG_STREAM_TOKENS[0]}-{LONG_STREAM_TOKENS[1]} "
        f"tokens under way on it; its agent exited {drained_s:.1f} s later"
    )


async def scale_in(ctx: Ctx) -> None:
    fleet, load = ctx.fleet, ctx.load
    heavy, light = load.rps, load.rps / 5

    async def two_ready() -> bool:
        return await fleet.ready_replicas() >= 2

    await fleet.until("a scale-up to 2 replicas under the heavy load", two_ready, 60)
    load.rps = light

    async def scaled_down() -> dict[str, Any] | None:
        decisions = (await fleet.json("/v1/decisions"))["decisions"]
        found = [d for d in decisions if d["kind"] == "scale-down"]
        return found[-1] if found else None

    decision = await fleet.until("a scale-down decision", scaled_down, 60)
    [victim] = decision["victims"]
    ctx.mark(decision["at"])
    streams = len(load.streaming(victim))
    agent = next(a for a in fleet.agents() if a.replica == victim)
    started = time.monotonic()

    async def gone() -> bool:
        return not pid_alive(agent.pid)

    await fleet.until(f"{victim}'s agent to exit", gone, 30)
    drained_s = time.monotonic() - started
    assert ctx.fault_at is not None
    finished = sum(1 for o in load.outcomes if o.replica == victim and (o.ended_at or 0) >= ctx.fault_at)
    await asyncio.sleep(ctx.after_s)
    ctx.notes.append(
        f"{heavy:g} req/s until the pool scaled to 2, then {light:.3g} req/s: scale-down drained {victim} "
        f"({streams} streams under way on it when the decision was seen, {finished} finished on it after the "
        f"decision), its agent exited {drained_s:.1f} s after the decision was seen"
    )


async def rolling_restart(ctx: Ctx) -> None:
    fleet = ctx.fleet
    originals = fleet.agents()

    async def both_restarted() -> list[dict[str, Any]] | None:
        history = (await fleet.json("/v1/leases"))["history"]
        released = {h["replica"] for h in history if h["event"] == "release"}
        return history if released >= {a.replica for a in originals} else None

    history = await fleet.until("both replicas' planned restarts", both_restarted, 90)
    ctx.mark(next(h["at"] for h in history if h["event"] == "grant"))
    await asyncio.sleep(ctx.after_s)
    history = (await fleet.json("/v1/leases"))["history"]
    events = [f"{h['event']} {h['replica']}" for h in history if h["event"] in ("grant", "release", "refuse")]
    fates = [f"{a.replica} {'serving' if pid_alive(a.pid) else 'stopped for good'}" for a in originals]
    listing = (await fleet.json("/v1/pools/qwen-7b/replicas"))["replicas"]
    ctx.notes.append(
        "restart window open, minUptimeHours reached under load, maxUnavailable 1: the leases went "
        + ", ".join(_squash(events))
        + f"; the original replicas at the end: {', '.join(fates)}; replicas listed: "
        + ", ".join(f"{r['replica']} {r['state']}" for r in listing if not r["stale"])
    )


def _squash(events: list[str]) -> list[str]:
    out: list[str] = []
    for event in events:
        if out and out[-1].split(" x")[0] == event:
            head, _, count = out[-1].partition(" x")
            out[-1] = f"{head} x{int(count or 1) + 1}"
        else:
            out.append(event)
    return out


async def two_gateways_sigterm(ctx: Ctx) -> None:
    fleet, forwarder = ctx.fleet, ctx.forwarder
    assert forwarder is not None
    gateway = fleet.gateways[0]
    streams = len(ctx.load.streaming())
    started = time.monotonic()
    gateway.child.process.send_signal(signal.SIGTERM)
    ctx.mark()
    code = await asyncio.to_thread(gateway.child.process.wait, 60)
    exited_s = time.monotonic() - started
    await asyncio.sleep(ctx.after_s)
    ctx.notes.append(
        f"two gateways behind a round-robin TCP forwarder; SIGTERM to one with {streams} streams under way in all; "
        f"it exited {code} after {exited_s:.1f} s; connections it refused meanwhile (sent to the other): "
        f"{forwarder.refused}"
    )


# 5-11 s on the bench's simulators: longer than the drain's shutdown timeout (grace 10 - propagation 0.5 - 5 s)
LONG_STREAM_TOKENS = (450, 900)


async def gateway_rolling_restart(ctx: Ctx) -> None:
    """Both gateways behind the forwarder restarted in turn, as a Deployment's rollout replaces its pods: each is
    SIGTERMed, and once it exited a new one starts on its ports; the next goes once the new one routes."""
    fleet, forwarder = ctx.fleet, ctx.forwarder
    assert forwarder is not None
    steps = []
    for old in list(fleet.gateways):
        streams = len(ctx.load.streaming())
        started = time.monotonic()
        old.child.process.send_signal(signal.SIGTERM)
        if ctx.fault_at is None:
            ctx.mark()
        code = await asyncio.to_thread(old.child.process.wait, 60)
        exited_s = time.monotonic() - started
        new = fleet.start_gateway(1.0, replacing=old)
        await fleet.routing(new, await fleet.ready_replicas())
        steps.append(
            f"{old.child.name} ({streams} streams under way in all) exited {code} after {exited_s:.1f} s, its "
            f"replacement routing {time.monotonic() - started:.1f} s after the SIGTERM"
        )
    await asyncio.sleep(ctx.after_s)
    ctx.notes.append(
        "two gateways behind a round-robin TCP forwarder, restarted one after the other on their ports: "
        + "; ".join(steps)
        + f"; connections refused meanwhile (sent to the other): {forwarder.refused}"
    )


async def canary_promotion(ctx: Ctx) -> None:
    """`POST /v1/rollouts` moves the alias the load asks for to the candidate pool step by step; once promoted the
    old pool is scaled to no replica, each drained."""
    fleet = ctx.fleet
    credential = ClientCredential.from_env(Kind.CONTROL_PLANE, fleet.env)
    assert credential is not None
    async with httpx.AsyncClient(base_url=fleet.cp_url, timeout=5.0, auth=BearerAuth(credential)) as http:
        started = await http.post("/v1/rollouts", json={"alias": CANARY_ALIAS, "candidate": CANARY_POOL})
        started.raise_for_status()
    ctx.mark()
    began = time.monotonic()

    async def promoted() -> dict[str, Any] | None:
        status: dict[str, Any] = await fleet.json(f"/v1/rollouts/{CANARY_ALIAS}")
        if status["phase"] not in ("baking", "promoted"):
            raise RuntimeError(f"the rollout ended {status['phase']}: {status.get('reason')}")
        return status if status["phase"] == "promoted" else None

    await fleet.until("the candidate promoted", promoted, 120)
    promoted_s = time.monotonic() - began

    async def baseline_gone() -> bool:
        replicas = (await fleet.json("/v1/pools/qwen-7b/replicas"))["replicas"]
        return all(r["state"] in ("draining", "stopped") for r in replicas)

    await fleet.until("the old pool drained to no replica", baseline_gone, 60)
    drained_s = time.monotonic() - began
    await asyncio.sleep(ctx.after_s)
    steps = [
        f"{d['weight_from']}->{d['weight_to']}% ({d['action']})"
        for d in (await fleet.json("/v1/decisions"))["decisions"]
        if d["kind"] == "rollout" and d["action"] != "hold"
    ]
    ctx.notes.append(
        f"alias {CANARY_ALIAS} rolled from qwen-7b to {CANARY_POOL}: {', '.join(steps)}; promoted {promoted_s:.1f} s "
        f"after the start, the old pool drained to no replica {drained_s:.1f} s after it"
    )


CANARY_ALIAS, CANARY_POOL = "chat", "qwen-7b-v2"
CANARY: dict[str, Any] = {
    "pools": [
        {"replicas": {"min": 1, "max": 2}},
        {"like": 0, "name": CANARY_POOL, "servedModelName": "qwen2.5-7b-instruct-v2"},
    ],
    "aliases": {
        CANARY_ALIAS: {
            "pools": {"qwen-7b": 100, CANARY_POOL: 0},
            "sticky": "none",
            "rollout": {
                "steps": [10, 50, 100],
                "bakeS": 3,
                "minSamples": 10,
                "tolerance": 0.5,
                "baselineAfter": "zero",
                "metrics": ["errorRate"],
            },
        }
    },
}


def _window_now() -> dict[str, Any]:
    """A restart window open from a minute ago (UTC), replicas due once their engine has run 9 s."""
    start = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%H:%M:%S")
    return {
        "enabled": True,
        "start": start,
        "durationMinutes": 30,
        "timezone": "UTC",
        "minUptimeHours": 0.0025,
        "maxUnavailable": 1,
    }


def scenarios() -> list[Scenario]:
    return [
        Scenario("engine-kill", "engine SIGKILL mid-stream", engine_sigkill),
        Scenario(
            "engine-hang",
            "engine SIGSTOP past the first-token timeout, then SIGCONT",
            engine_sigstop,
            {"gateway": {"timeouts": {"firstTokenS": 2}}},
            changes="gateway firstTokenS 2",
        ),
        Scenario(
            "agent-kill",
            "agent SIGKILL",
            agent_sigkill,
            {"pools": [{"replicas": {"min": 2, "max": 3}}]},
            changes="replicas 2..3 (room for a replacement)",
        ),
        Scenario("gateway-term", "gateway SIGTERM, streams in flight", gateway_sigterm),
        Scenario("control-plane-kill", "control plane SIGKILL, restarted", control_plane_sigkill),
        Scenario(
            "redis-kill",
            "quota Redis SIGKILL, restarted (fail-open)",
            redis_sigkill,
            {"gateway": {"quotaBackend": "redis"}},
            redis=True,
            needs="redis-server",
            changes="gateway quotaBackend redis (a redis-server of its own), quotaStoreDown fail-open",
        ),
        Scenario(
            "scale-in",
            "replica scaled in under load (drain)",
            scale_in,
            {"pools": [{"replicas": {"min": 1, "max": 2}, "engine": {"maxNumSeqs": 8}}]},
            changes="replicas 1..2, maxNumSeqs 8 (planned 3 req/s per replica)",
        ),
        Scenario(
            "rolling-restart",
            "rolling restart (restart window, leases)",
            rolling_restart,
            {"pools": [{"restartWindow": "open"}]},
            changes="restartWindow open since a minute ago, minUptimeHours 0.0025 (9 s), maxUnavailable 1",
        ),
        Scenario(
            "two-gateways",
            "two gateways behind one address, SIGTERM one",
            two_gateways_sigterm,
            {"gateway": {"replicas": 2}},
            gateways=2,
            changes="gateway.replicas 2",
        ),
        Scenario(
            "drain-long",
            "replica drained, streams longer than its drain (resumed)",
            drain_long,
            changes="from the fault on, streams of 450-900 tokens (5-11 s), longer than the 4 s the drain leaves them",
        ),
        Scenario(
            "gateway-rollout",
            "two gateways behind one address, restarted in turn",
            gateway_rolling_restart,
            {"gateway": {"replicas": 2}},
            gateways=2,
            changes="gateway.replicas 2",
        ),
        Scenario(
            "canary-promotion",
            "canary rollout promoted, the old pool drained",
            canary_promotion,
            CANARY,
            model=CANARY_ALIAS,
            changes=f"pools qwen-7b and its twin {CANARY_POOL} (1..2 each) behind the alias {CANARY_ALIAS} (100/0), "
            "the load asking for the alias; steps 10, 50, 100, bake 3 s, 10 requests a side, judged on errors",
        ),
    ]


def stack_overrides(scenario: Scenario, redis_url: str | None) -> dict[str, Any]:
    """The scenario's stack changes, made concrete now (a restart window opens relative to the clock)."""
    overrides: dict[str, Any] = yaml.safe_load(yaml.safe_dump(scenario.overrides))
    for pool in overrides.get("pools", []):
        if pool.get("restartWindow") == "open":
            pool["restartWindow"] = _window_now()
    if redis_url is not None:
        overrides.setdefault("gateway", {})["redisUrl"] = redis_url
    return overrides
