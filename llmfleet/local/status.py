"""Status: ``llmfleet status [--json]``: canary rollouts (weights, step, window), pools, their error budget spent,
replicas (engine URL, state, load: waiting, running, KV usage, the prefix cache's recent hit rate, TTFT p99) and
the last decisions. The control plane's reads need a credential: ``$LLMFLEET_CONTROL_TOKEN`` (or
``$LLMFLEET_CONTROL_TOKEN_FILE``), sent to the control plane only."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx

from fleet.protocol.control_auth import CONTROL_TOKEN_ENV, operator_auth
from fleet.spec.errors import SpecError
from fleet.spec.loader import control_plane_url

__all__ = ["UNAUTHORIZED", "add_arguments", "collect", "format_status", "run"]

UNAUTHORIZED = f"set ${CONTROL_TOKEN_ENV} to the fleet secret (`llmfleet up` keeps it in <log dir>/control-token)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default="local", help="stack whose control plane to ask (default: local)")
    parser.add_argument("--control-plane", default=None, help="control plane URL (default: from the stack)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--decisions", type=int, default=5, help="decisions to show per pool (default 5)")


def collect(client: httpx.Client, decisions: int) -> dict[str, Any]:
    """Pools with their replicas and last ``decisions`` decisions, as the control plane reports them."""
    pools = client.get("/v1/pools").raise_for_status().json()["pools"]
    for pool in pools:
        listing = client.get(f"/v1/pools/{pool['pool']}/replicas").raise_for_status().json()
        pool["replica_list"] = listing["replicas"]
        log = client.get("/v1/decisions", params={"pool": pool["pool"], "limit": decisions}).raise_for_status()
        pool["decisions"] = log.json()["decisions"]
        budget = client.get(f"/v1/pools/{pool['pool']}/budget")
        pool["budget"] = None if budget.status_code == 404 else budget.raise_for_status().json()  # 404: older
    found = client.get("/v1/rollouts")
    rollouts = [] if found.status_code == 404 else found.raise_for_status().json()["rollouts"]  # 404: older
    return {"pools": pools, "rollouts": rollouts, "at": time.time()}


def _num(value: Any, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def _budget_line(budget: dict[str, Any]) -> str:
    """``error budget 30d: availability 12% spent, ttft 3%, error-rate 2%: ok`` (``llmfleet slo`` has the rest)."""
    slos = budget["slos"]
    if not slos:
        return "  error budget: not computed yet" + (f" ({budget['error']})" if budget.get("error") else "")
    spent = ", ".join(f"{b['slo']} {b['spent']:.0%}" for b in slos)
    worst = max(slos, key=lambda b: b["spent"])["status"]
    frozen = "" if budget["allows_changes"] else ", restarts and rollouts FROZEN"
    return f"  error budget {slos[0]['window']} spent: {spent} ({worst}{frozen})"


def _rollout_line(r: dict[str, Any]) -> str:
    """``rollout chat: qwen-v1 -> qwen-v2 at 10% (baking, step 1 of 3): baking 10%: 2 s of 3 s``."""
    where = f"step {r['step'] + 1} of {len(r['steps'])}" if r["phase"] == "baking" else r["phase"]
    sides = "; ".join(
        f"{s['pool']} {s['requests']} req"
        + ("" if s["error_rate"] is None else f" {s['error_rate']:.1%} err")
        + ("" if s["ttft_p99_s"] is None else f" TTFT99 {s['ttft_p99_s'] * 1000:.0f}ms")
        for s in r["window"]
    )
    return (
        f"rollout {r['alias']}: {r['baseline']} -> {r['candidate']} at {r['weight']}% ({where}): {r['reason']}"
        f"\n  window: {sides}"
    )


def _starts_line(starts: dict[str, Any]) -> str:
    """The measured starts beside coldStartSeconds, and the last start's phases the engine logged."""
    last = starts["last"]
    phases = ", ".join(
        f"{name} {last[key]:.1f}s"
        for name, key in (("fetch", "fetch_s"), ("load", "load_s"), ("compile", "compile_s"), ("graphs", "graphs_s"))
        if last.get(key) is not None
    )
    return (
        f"  starts: median {starts['p50_s']:.1f}s, longest {starts['max_s']:.1f}s over {starts['count']} "
        f"(coldStartSeconds {starts['cold_start_s']:g}s); last: {phases or 'no phase logged'}, ready "
        f"{last['ready_s']:.1f}s after launch"
    )


def _node_starts_line(starts: dict[str, Any]) -> str:
    """The GPU group's measured node starts beside nodeColdStartSeconds, and the last node's steps."""
    last = starts["last"]
    return (
        f"  node starts ({starts['group']}): median {starts['p50_s']:.0f}s, longest {starts['max_s']:.0f}s over "
        f"{starts['count']} (nodeColdStartSeconds {starts['node_cold_start_s']:g}s); last: {last['node']} "
        f"registered {last['registered_s']:.0f}s, ready {last['ready_s']:.0f}s, image pull {last['pull_s']:.0f}s"
    )


def format_status(status: dict[str, Any]) -> str:
    lines: list[str] = [_rollout_line(r) for r in status.get("rollouts", [])]
    if lines:
        lines.append("")
    for pool in status["pools"]:
        lines.append(
            f"pool {pool['pool']}  model {pool['model']}  replicas {pool['replicas']} "
            f"(ready {pool['ready']}, stale {pool['stale']})  min {pool['min']} max {pool['max']}"
        )
        if pool.get("budget") is not None:
            lines.append(_budget_line(pool["budget"]))
        if pool.get("starts") is not None:
            lines.append(_starts_line(pool["starts"]))
        if pool.get("node_starts") is not None:
            lines.append(_node_starts_line(pool["node_starts"]))
        header = (
            f"  {'REPLICA':<22} {'STATE':<10} {'ENGINE':<24} {'WAIT':>5} {'RUN':>5} {'KV':>5} {'HIT':>5} {'TTFT99':>7}"
        )
        lines.append(header)
        for r in pool["replica_list"]:
            load = r["last_report"]
            state = r["state"] + ("*" if r["stale"] else "")
            lines.append(
                f"  {r['replica']:<22} {state:<10} {r['engine_url']:<24} {_num(load.get('waiting')):>5} "
                f"{_num(load.get('running')):>5} {_num(load.get('kv_usage'), '{:.0%}'):>5} "
                f"{_num(load.get('prefix_hit_rate'), '{:.0%}'):>5} "
                f"{_num(load.get('ttft_p99_s') and load['ttft_p99_s'] * 1000, '{:.0f}ms'):>7}"
            )
        if any(r["stale"] for r in pool["replica_list"]):
            lines.append("  * stale: no report within controlPlane.staleAfterS; its load is unknown")
        lines.append("  recent decisions:")
        for d in pool["decisions"] or []:
            when = time.strftime("%H:%M:%S", time.localtime(d["at"]))
            change = f"{d['current']} -> {d['target']}"
            if d["kind"] == "rollout":  # a weight, not replicas, moves
                change = f"{d['weight_from']}% -> {d['weight_to']}%"
            lines.append(f"    {when} {d['kind']:<10} {change}  {d['reason']}")
        if not pool["decisions"]:
            lines.append("    (none yet)")
        lines.append("")
    return "\n".join(lines).rstrip()


def run(args: argparse.Namespace) -> int:
    try:
        url = control_plane_url(args.stack, args.control_plane)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        with httpx.Client(base_url=url, timeout=5.0, auth=operator_auth(url)) as client:
            status = collect(client, args.decisions)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 401:
            raise
        print(f"error: the control plane at {url} wants a credential: {UNAUTHORIZED}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"error: control plane at {url} not reachable ({exc}); is `llmfleet up` running?", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0
