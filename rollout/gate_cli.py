"""``llmfleet gate``: the capacity-regression gate between two pools of a stack (see `rollout.gate`).

Locally (no URLs) it starts one engine per pool through the agent's own launcher (simulated pools only; a
vLLM pool needs a GPU, so give its URL), with ``--degradation X`` (every engine step X times longer, as
``--fault-slowdown``) or ``--gpu-profile NAME`` applied to the candidate to rehearse a worse one. Against a
cluster, ``--baseline-url`` and ``--candidate-url`` name one replica of each (e.g. ``kubectl port-forward``), with
the engine key in ``$LLMFLEET_ENGINE_API_KEY``.

Exit status: 0 the candidate passes, 1 it is worse than the tolerance on some metric (named), 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx

from agent.launchers import EngineProcess, LaunchConfig, make_launcher
from fleet.capacity.plan import plan_pool
from fleet.protocol.control_auth import ENGINE_API_KEY_ENV
from fleet.protocol.ports import free_port
from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from fleet.spec.stack import FleetSpec, PoolSpec
from rollout.compare import Figures, Verdict, compare
from rollout.gate import GatePlan, SideResult, figures, run_gate
from rollout.sweep import Target, make_profile, quantile

__all__ = ["add_arguments", "render", "run"]

DEFAULT_TOLERANCE = 0.10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name or file")
    parser.add_argument("--baseline", required=True, help="the pool serving today")
    parser.add_argument("--candidate", required=True, help="the pool with the new model, engine or GPU")
    parser.add_argument("--baseline-url", default=None, help="one baseline replica (default: start a simulator)")
    parser.add_argument("--candidate-url", default=None, help="one candidate replica (default: start a simulator)")
    parser.add_argument("--tolerance", type=float, default=None, help="worst allowed change (default 0.10)")
    parser.add_argument("--rates", default="0.6,0.8,1,1.2,1.4", help="offered rates, x the planned per-replica rate")
    parser.add_argument("--requests-per-step", type=int, default=100)
    parser.add_argument("--time-scale", type=float, default=None, help="simulators' clock speed (default: the pool's)")
    parser.add_argument("--degradation", type=float, default=None, help="candidate simulator: steps X times longer")
    parser.add_argument("--gpu-profile", default=None, help="candidate simulator: this GPU instead of the pool's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write both rows and the deltas here")


class GateInputError(ValueError):
    """Bad arguments for this stack: exit 2 with the message."""


def _pool(spec: FleetSpec, name: str, flag: str) -> PoolSpec:
    for pool in spec.pools:
        if pool.name == name:
            return pool
    raise GateInputError(f"{flag} {name!r}: no such pool; pools: {', '.join(p.name for p in spec.pools)}")


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(sorted(float(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise GateInputError(f"--rates {text!r}: a comma-separated list of positive numbers") from None
    if not rates or any(r <= 0 for r in rates):
        raise GateInputError(f"--rates {text!r}: a comma-separated list of positive numbers")
    return rates


@contextlib.asynccontextmanager
async def _simulator(pool: PoolSpec, extra: Sequence[str], log: Path) -> AsyncIterator[str]:
    """One engine for ``pool`` through the agent's launcher; yields its URL once /health answers 200."""
    if pool.engine.kind != "sim":
        raise GateInputError(f"pool {pool.name!r} runs {pool.engine.kind}: give its replica's URL (--*-url)")
    port = free_port()
    launcher = make_launcher(pool, LaunchConfig(host="127.0.0.1", port=port, log_path=log, extra_args=extra))
    process: EngineProcess = await launcher.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + pool.cold_start_seconds + 30.0
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                if process.returncode is not None:
                    raise GateInputError(f"the {pool.name} simulator exited; its log: {log}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{url}/health")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise GateInputError(f"the {pool.name} simulator did not become healthy; its log: {log}")
                await asyncio.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=15.0)
        except TimeoutError:
            process.kill()
            await process.wait()


def render_steps(sides: Sequence[SideResult]) -> str:
    """One line per step and side: offered rate, completed, errors, TTFT and ITL p50/p99 (engine time)."""

    def ms(values: list[float], q: float) -> str:
        value = quantile(values, q)
        return "-" if value is None else f"{value * 1000:.0f}"

    lines = [f"{'step req/s':>10}  {'pool':<20}{'ok/sent':>9}{'TTFT p50/p99 ms':>17}{'TPOT p50/p99 ms':>16}"]
    for i in range(len(sides[0].steps)):
        for side in sides:
            s = side.steps[i]
            lines.append(
                f"{s.rate_rps:>10.2f}  {side.name:<20}{f'{s.ok}/{s.sent}':>9}"
                f"{ms(s.ttft_s, 0.5) + '/' + ms(s.ttft_s, 0.99):>17}{ms(s.tpot_s, 0.5) + '/' + ms(s.tpot_s, 0.99):>16}"
            )
    return "\n".join(lines)


def render(names: tuple[str, str], rows: tuple[Figures, Figures], verdict: Verdict, tolerance: float) -> str:
    def fmt(metric: str, value: float | None) -> str:
        if value is None:
            return "-"
        if metric.startswith("throughput"):
            return f"{value:.2f} req/s"
        if metric == "error rate":
            return f"{value:.2%}"
        return f"{value * 1000:.0f} ms"

    lines = [f"{'metric':<28}{names[0]:>16}{names[1]:>16}{'change':>10}  verdict (tolerance {tolerance:.0%})"]
    for d in verdict.deltas:
        change = "-" if d.change is None else f"{d.change:+.1%}"
        mark = "WORSE" if d.worse else "ok"
        lines.append(
            f"{d.metric:<28}{fmt(d.metric, d.baseline):>16}{fmt(d.metric, d.candidate):>16}{change:>10}  {mark}"
        )
    lines.append(f"{'requests completed':<28}{rows[0].samples:>16}{rows[1].samples:>16}")
    outcome = "PASS" if verdict.passed else f"FAIL: {', '.join(verdict.failed_metrics)} worse than {tolerance:.0%}"
    lines.append(f"gate: {outcome}")
    return "\n".join(lines)


def _candidate_args(args: argparse.Namespace, scale: float) -> list[str]:
    """The candidate simulator's arguments: the time scale, and the degradation and GPU profile asked for."""
    extra = ["--time-scale", f"{scale:g}"]
    if args.degradation is not None:
        if args.degradation < 1.0:
            raise GateInputError("--degradation X: each engine step X >= 1 times longer")
        extra += ["--fault-slowdown", f"{args.degradation:g}"]
    if args.gpu_profile is not None:
        extra += ["--gpu-profile", args.gpu_profile]
    return extra


def _write_json(
    path: Path, names: tuple[str, str], rows: tuple[Figures, Figures], verdict: Verdict, tolerance: float
) -> None:
    """The gate's figures and verdict as JSON (``--json``)."""
    document = {
        "baseline": {"pool": names[0], **rows[0].__dict__},
        "candidate": {"pool": names[1], **rows[1].__dict__},
        "tolerance": tolerance,
        "passed": verdict.passed,
        "deltas": [d.__dict__ for d in verdict.deltas],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


async def _gate(args: argparse.Namespace, spec: FleetSpec) -> int:
    base_pool = _pool(spec, args.baseline, "--baseline")
    cand_pool = _pool(spec, args.candidate, "--candidate")
    if base_pool.name == cand_pool.name:
        raise GateInputError("--baseline and --candidate name the same pool")
    rates = _rates(args.rates)
    if args.requests_per_step < 10:
        raise GateInputError("--requests-per-step: at least 10 (a p99 needs samples)")
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    if not 0.0 <= tolerance < 1.0:
        raise GateInputError(f"--tolerance {tolerance}: a fraction in [0, 1)")
    local = args.baseline_url is None or args.candidate_url is None
    scale = args.time_scale if args.time_scale is not None else (base_pool.engine.sim.time_scale if local else 1.0)
    if scale <= 0:
        raise GateInputError("--time-scale must be > 0")
    cand_extra = _candidate_args(args, scale)
    workload = base_pool.workload
    plan = GatePlan(
        per_replica_rps=plan_pool(spec, base_pool).per_replica_qps,
        rate_multipliers=rates,
        requests_per_step=args.requests_per_step,
        ttft_slo_s=base_pool.slo.ttft_p99_ms / 1000.0,
        time_scale=scale,
        seed=args.seed,
    )
    profile = make_profile(
        workload.mean_prompt_tokens, workload.mean_output_tokens, args.requests_per_step * len(rates), args.seed
    )
    key = os.environ.get(ENGINE_API_KEY_ENV) or None
    print(
        f"gate: {cand_pool.name} against {base_pool.name}, {len(rates)} steps of {args.requests_per_step} requests "
        f"at {', '.join(f'{r:g}' for r in rates)} x {plan.per_replica_rps:.2f} req/s, "
        f"TTFT SLO {plan.ttft_slo_s * 1000:g} ms",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="llmfleet-gate-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            base_url = args.baseline_url or await stack.enter_async_context(
                _simulator(base_pool, ["--time-scale", f"{scale:g}"], Path(tmp) / "baseline.log")
            )
            cand_url = args.candidate_url or await stack.enter_async_context(
                _simulator(cand_pool, cand_extra, Path(tmp) / "candidate.log")
            )
            targets = (
                Target(base_pool.name, base_url.rstrip("/"), base_pool.served_name, key),
                Target(cand_pool.name, cand_url.rstrip("/"), cand_pool.served_name, key),
            )
            sides = await run_gate(targets, profile, plan)
    print(render_steps(sides))
    rows = (figures(sides[0].steps, rates, plan), figures(sides[1].steps, rates, plan))
    verdict = compare(rows[0], rows[1], tolerance)
    print(render((base_pool.name, cand_pool.name), rows, verdict, tolerance))
    if args.json is not None:
        _write_json(args.json, (base_pool.name, cand_pool.name), rows, verdict, tolerance)
    return 0 if verdict.passed else 1


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.stack).spec
        return asyncio.run(_gate(args, spec))
    except (SpecError, GateInputError) as exc:
        print(f"llmfleet gate: {exc}", file=sys.stderr)
        return 2
