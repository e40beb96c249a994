"""Chaos: one fault per scenario under a steady streamed load through real processes, and one table of what
the clients saw.

    .venv/bin/python bench/chaos.py [--quick | --long] [--rps R] [--only NAME ...] [--keep-logs]

Each scenario starts its own local fleet on loopback, part by part as ``llmfleet up`` wires it
(`chaos_harness.Fleet`: the control plane with the local actuator, which launches agents supervising simulated
engines; gateways discovering replicas from it; all on free ports, every file in a temp folder). A load generator
in this process sends Poisson streamed chat completions (`chaos_load.Load`, every answer checked word for word);
once streams are under way one fault is injected, the load goes on for a while (``--quick``: 5 s, ``--long``:
20 s), then sending stops and every request in flight is waited for. Printed per scenario: requests sent,
completed, streams resumed (the gateways' ``llmfleet_gateway_resumed_streams_total``, read from their admin
ports), clear errors (an HTTP error status, an SSE error event, or no response), silent truncations (200 and no
error event, but no ``finish_reason``/``[DONE]`` or a gap in the text) and 5xx (status or error event code), then
a note per scenario (what happened, in words, and the control plane's scaling actions). A scenario that cannot
run (no ``redis-server``, a fleet that does not come up) is a row saying why. A bench: it prints, never asserts.

Scenarios (`chaos_faults`; ``--only`` takes these names): engine-kill, engine-hang (SIGSTOP past the first-token
timeout, then SIGCONT), agent-kill, gateway-term (SIGTERM with streams in flight), control-plane-kill (SIGKILL,
restarted on its port and state dir), redis-kill (the quota Redis, fail-open), scale-in (the autoscaler drains a
replica under load), rolling-restart (the pool's restart window with leases), two-gateways (two gateways behind a
round-robin TCP forwarder, SIGTERM one). About 4-5 minutes on two busy cores (fleet start-ups are most of it).

Only processes it started are killed: by pid, by process group, or by the marker every process of a scenario
carries in its environment (`chaos_harness.sweep`), also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# bench/engine_sim.py would shadow the engine_sim package: put the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_faults import Ctx, Scenario, scenarios, stack_overrides  # noqa: E402
from bench.chaos_harness import BASE, Fleet, Forwarder, sweep  # noqa: E402
from bench.chaos_load import Load  # noqa: E402
from fleet.protocol.keys import DEMO_API_KEY  # noqa: E402
from fleet.protocol.ports import free_port  # noqa: E402

MODEL = "qwen2.5-7b-instruct"
LEAD_S = 3.0  # steady load before the fault
UNDER_WAY = 6  # and at least this many streams under way (first token seen)


@dataclass
class Row:
    scenario: Scenario
    sent: int = 0
    completed: int = 0
    resumed: int = 0
    resumed_failed: int = 0
    errors: int = 0
    truncated: int = 0
    server_errors: int = 0
    notes: list[str] = field(default_factory=list)
    not_run: str | None = None
    seconds: float = 0.0


# -- running a scenario ----------------------------------------------------------------------------------------
async def run_scenario(scenario: Scenario, folder: Path, marker: str, args: argparse.Namespace) -> Row:
    row = Row(scenario)
    if scenario.needs and shutil.which(scenario.needs) is None:
        row.not_run = f"{scenario.needs} is not installed"
        return row
    started = time.monotonic()
    redis_port = free_port() if scenario.redis else 0
    redis_url = f"redis://127.0.0.1:{redis_port}/0" if redis_port else None
    fleet = Fleet(folder, marker, stack_overrides(scenario, redis_url), redis_port=redis_port)
    forwarder: Forwarder | None = None
    load_task: asyncio.Task[None] | None = None
    scraper: asyncio.Task[None] | None = None
    try:
        await fleet.start(gateways=scenario.gateways, redis=scenario.redis)
        url = fleet.gateways[0].url
        if scenario.gateways > 1:
            forwarder = Forwarder([g.port for g in fleet.gateways])
            await forwarder.start()
            url = forwarder.url
        model = scenario.model or MODEL
        load = Load(url, DEMO_API_KEY, model, args.rps, seed=args.seed, tokenizer=fleet.engine_tokenizer())
        load_task = asyncio.create_task(load.run())
        scraper = asyncio.create_task(_scrape_forever(fleet))
        await asyncio.sleep(LEAD_S)
        await load.wait_streaming(UNDER_WAY, timeout_s=15)
        ctx = Ctx(fleet, load, args.after, forwarder)
        await scenario.inject(ctx)
        load.stop()
        await asyncio.wait_for(load_task, timeout=90)
        await fleet.scrape()
        row.notes += ctx.notes
        with contextlib.suppress(Exception):  # a control plane killed for good has no decisions to show
            row.notes.append(await _scaling(fleet))
        _tally(row, load, fleet, ctx.fault_at)
    except Exception as exc:  # a scenario that could not run is a row saying why, not the end of the table
        row.not_run = f"failed: {type(exc).__name__}: {exc}"
    finally:
        if load_task is not None and not load_task.done():
            load_task.cancel()
        if scraper is not None:
            scraper.cancel()
        if forwarder is not None:
            await forwarder.close()
        await fleet.close()
        row.seconds = time.monotonic() - started
    return row


async def _scaling(fleet: Fleet) -> str:
    """The control plane's scaling actions after the pool's first launch, in short."""
    decisions = (await fleet.json("/v1/decisions?limit=1000"))["decisions"]
    acted = [d for d in decisions if d["kind"] != "hold" and d["current"] > 0]
    if not acted:
        return "no scaling action"
    words = []
    for d in acted:
        victims = f" [{', '.join(d['victims'])}]" if d.get("victims") else ""
        words.append(f"{d['kind']} {d['current']}->{d['target']}{victims} ({d['reason'].split(' (')[0]})")
    return "control plane: " + ", ".join(words)


async def _scrape_forever(fleet: Fleet) -> None:
    while True:
        await fleet.scrape()
        await asyncio.sleep(0.5)


def _tally(row: Row, load: Load, fleet: Fleet, fault_at: float | None) -> None:
    verdicts = load.counts()
    row.sent = len(load.outcomes)
    row.completed = verdicts["completed"]
    row.errors = verdicts["error"]
    row.truncated = verdicts["truncated"]
    row.server_errors = sum(o.server_error for o in load.outcomes)
    row.resumed = int(sum(g.resumed.get("completed", 0) + g.resumed.get("failed", 0) for g in fleet.gateways))
    row.resumed_failed = int(sum(g.resumed.get("failed", 0) for g in fleet.gateways))
    failed: dict[str, list[float]] = {}
    for o in load.outcomes:
        if o.verdict != "completed":
            failed.setdefault(o.kind, []).append(o.sent_at - (fault_at or o.sent_at))
    words = []
    for kind, sent in sorted(failed.items(), key=lambda item: -len(item[1])):
        when = f"sent {min(sent):+.1f}..{max(sent):+.1f} s from the fault" if fault_at is not None else ""
        words.append(f"{kind} x{len(sent)} ({when})" if when else f"{kind} x{len(sent)}")
    if words:
        row.notes.append("not completed: " + ", ".join(words))


# -- output ----------------------------------------------------------------------------------------------------
def _table(rows: list[Row]) -> str:
    head = "| # | scenario | sent | completed | resumed | clear errors | silent truncations | 5xx |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(rows, 1):
        if row.not_run is not None:
            lines.append(f"| {i} | {row.scenario.title} | not run: {row.not_run} | | | | | |")
            continue
        resumed = f"{row.resumed}" + (f" ({row.resumed_failed} failed)" if row.resumed_failed else "")
        lines.append(
            f"| {i} | {row.scenario.title} | {row.sent} | {row.completed} | {resumed} | {row.errors} | "
            f"{row.truncated} | {row.server_errors} |"
        )
    return "\n".join(lines)


def _setup(args: argparse.Namespace) -> str:
    pool = BASE["pools"][0]
    sim = pool["engine"]["sim"]
    return (
        f"machine: {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable)\n"
        f"stack: stacks/Pulumi.local.yaml with simulated {sim['gpuProfile']} engines (timeScale {sim['timeScale']:g}, "
        f"startupSeconds {sim['startupSeconds']:g}, maxNumSeqs {pool['engine']['maxNumSeqs']}), "
        f"{pool['replicas']['min']} replicas, coldStartSeconds {pool['coldStartSeconds']}, resumeStreams true, "
        f"drain {pool['drain']['graceSeconds']} s (propagation {pool['drain']['propagationSeconds']} s), "
        f"control loop {BASE['autoscaling']['intervalS']} s, reports every "
        f"{BASE['controlPlane']['reportIntervalS']} s (stale after {BASE['controlPlane']['staleAfterS']} s), "
        f"firstTokenS {BASE['gateway']['timeouts']['firstTokenS']}; per-scenario changes in the notes\n"
        f"load: Poisson {args.rps:g} req/s of streamed chat completions (max_tokens 64-192, ~1-2.5 s each), "
        f"fault after {LEAD_S:g} s once {UNDER_WAY} streams are under way, then {args.after:g} s more load after the "
        f"fault (and its recovery where the scenario waits for one); seed {args.seed}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="5 s of load after each fault (the default)")
    mode.add_argument("--long", action="store_true", help="20 s of load after each fault")
    parser.add_argument(
        "--rps", type=float, default=8.0, help="requests per second (scale-in: a fifth of it once scaled out)"
    )
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep-logs", action="store_true", help="keep the fleets' logs and print where")
    args = parser.parse_args()
    args.after = 20.0 if args.long else 5.0
    chosen = [s for s in scenarios() if args.only is None or s.name in args.only]
    if args.only and len(chosen) != len(args.only):
        parser.error(f"scenarios: {', '.join(s.name for s in scenarios())}")

    run_id = os.urandom(6).hex()
    root = Path(tempfile.mkdtemp(prefix="llmfleet-chaos-"))
    print(_setup(args), flush=True)

    def terminate(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    rows: list[Row] = []
    started = time.monotonic()
    try:
        for scenario in chosen:
            print(f"-- {scenario.name}: {scenario.title} ...", flush=True)
            row = asyncio.run(run_scenario(scenario, root / scenario.name, f"{run_id}/{scenario.name}", args))
            rows.append(row)
            print(f"   {row.seconds:.0f} s; " + ("; ".join(row.notes) or row.not_run or ""), flush=True)
    except KeyboardInterrupt:
        print("interrupted: cleaning up", file=sys.stderr)
        return 130
    finally:
        swept = sweep(run_id)
        if swept:
            print(f"killed {swept} leftover process(es)", file=sys.stderr)
        if args.keep_logs:
            print(f"logs: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(_table(rows))
    print()
    for i, row in enumerate(rows, 1):
        text = "; ".join(filter(None, [row.scenario.changes, *row.notes]))
        print(f"{i}. {row.scenario.name}: {text}")
    print(f"\n{len(rows)} scenarios in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
