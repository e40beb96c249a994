"""``llmfleet rollout start|status|abort --stack NAME --alias A [--candidate POOL]``: canary rollouts, run by the
control plane (`control_plane.rollouts`).

``start`` asks the stack's control plane to roll the alias from its baseline to ``--candidate`` with the stack's
``aliases.<A>.rollout`` settings; from then on the control plane steps the weight up, rolls back or promotes on
its own. ``status`` shows where it is and the window it is judged on; ``abort`` takes the candidate back to 0.
Starting and aborting carry the control credential of ``$LLMFLEET_CONTROL_TOKEN`` (the fleet secret) or
``$LLMFLEET_CONTROL_TOKEN_FILE`` (a token for the control plane's service account).

Exit status: 0 done (``status``: the rollout is running or promoted), 1 refused by the control plane (the reason
printed; ``status``: rolled back or aborted), 2 bad input or the control plane unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx

from fleet.protocol.control_auth import operator_auth
from fleet.spec.errors import SpecError
from fleet.spec.loader import control_plane_url

__all__ = ["add_arguments", "format_rollout", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "status", "abort"))
    parser.add_argument("--stack", default="local", help="stack whose control plane to ask (default: local)")
    parser.add_argument("--alias", default=None, help="the alias rolled out (status: all when omitted)")
    parser.add_argument("--candidate", default=None, help="start: the pool rolled out to")
    parser.add_argument("--control-plane", default=None, help="control plane URL (default: from the stack)")
    parser.add_argument("--json", action="store_true", help="print the control plane's JSON")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}ms"


def format_rollout(r: dict[str, Any]) -> str:
    """A rollout in a few lines: weights and phase, the reason, both sides over the current window."""
    steps = "/".join(str(s) for s in r["steps"])
    step = f"step {r['step'] + 1} of {len(r['steps'])}" if r["phase"] == "baking" else r["phase"].upper()
    lines = [
        f"rollout {r['alias']}: {r['baseline']} -> {r['candidate']} at {r['weight']}% ({step}; steps {steps}%, "
        f"bake {r['bake_s']:g} s, >= {r['min_samples']} requests a side, tolerance {r['tolerance']:.0%} on "
        f"{', '.join(r['metrics'])})",
        f"  {r['reason']}",
        f"  window since {time.strftime('%H:%M:%S', time.localtime(r['step_started_at']))}:",
    ]
    for side in r["window"]:
        rate = "-" if side["error_rate"] is None else f"{side['error_rate']:.2%}"
        lines.append(
            f"    {side['pool']:<16} requests {side['requests']:>6}  errors {rate:>7}  TTFT p99 "
            f"{_ms(side['ttft_p99_s']):>9}  TPOT p99 {_ms(side['tpot_p99_s']):>8}"
        )
    return "\n".join(lines)


def _refusal(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"


def run(args: argparse.Namespace) -> int:
    if args.action in ("start", "abort") and args.alias is None:
        print(f"llmfleet rollout {args.action}: --alias is required", file=sys.stderr)
        return 2
    if args.action == "start" and args.candidate is None:
        print("llmfleet rollout start: --candidate is required", file=sys.stderr)
        return 2
    try:
        url = control_plane_url(args.stack, args.control_plane)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        with httpx.Client(base_url=url, timeout=10.0, auth=operator_auth(url)) as client:
            if args.action == "start":
                response = client.post("/v1/rollouts", json={"alias": args.alias, "candidate": args.candidate})
            elif args.action == "abort":
                response = client.delete(f"/v1/rollouts/{args.alias}")
            else:
                response = client.get("/v1/rollouts" + (f"/{args.alias}" if args.alias else ""))
    except httpx.HTTPError as exc:
        print(f"error: control plane at {url} not reachable ({exc}); is the fleet running?", file=sys.stderr)
        return 2
    if response.status_code != 200:
        print(f"llmfleet rollout {args.action}: {_refusal(response)}", file=sys.stderr)
        return 1
    body = response.json()
    rollouts = body["rollouts"] if "rollouts" in body else [body]
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print("\n".join(format_rollout(r) for r in rollouts) or "no rollouts")
    if args.action == "status" and any(r["phase"] in ("rolled-back", "aborted") for r in rollouts):
        return 1
    return 0
