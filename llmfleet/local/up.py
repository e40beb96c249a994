"""Up: ``llmfleet up --stack local`` runs the whole fleet on this machine until Ctrl-C.

    control plane (with the local actuator) -> it starts each pool's minimum agents, each supervising its
    simulated engine -> the gateway, discovering replicas from the control plane.

A disaggregated pool's prefill role pool (``<pool>-prefill``, `fleet.spec.stack.FleetSpec.engine_pools`) is a pool
here like any: ``llmfleet up --stack local-pd`` waits for its minimum prefill replicas and its minimum decode
replicas, each engine launched with its role's ``--kv-transfer-config`` (`agent.launchers.kv_transfer`).

Then it prints the gateway URL, the demo API key and ready-to-paste ``curl`` and ``openai`` examples. SIGINT or
SIGTERM stops the gateway (in-flight requests finish), then the control plane (which drains and stops its
agents), then sweeps any process left in the tree. Exit status: 0 after a clean stop, 1 when a part failed.

``--live`` (``make up`` passes it) refreshes a compact view of the traffic below the banner (`llmfleet.local.live`);
``--live-png PATH`` rewrites a PNG of the same series every ``--live-png-every`` seconds. Where ``prometheus`` is
on PATH a local Prometheus scrapes every part and evaluates the cluster's alert rules (`llmfleet.local.prometheus`,
`fleet.slo.rules`;
``--no-prometheus`` skips it); it is stopped first on the way out, and its failing never stops the fleet.

Control traffic is authenticated: a fresh fleet secret (32 random bytes) goes to the control plane (which hands it
to the agents it starts) and to the gateway through ``$LLMFLEET_CONTROL_TOKEN``, never on a command line, so the
control plane runs ``--auth shared-secret`` and refuses reports, leases and reads (the replica list names every
engine) from anything else on this machine; ``up``'s own reads (readiness, the live view, Prometheus' targets) carry
it too. When ``$LLMFLEET_CONTROL_TOKEN`` is already set, that is the fleet secret instead, so that operator commands
(``llmfleet status``, ``llmfleet rollout``) work from the same shell; either way it is written to
``<log dir>/control-token`` (mode 0600), which the banner names for other shells.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from control_plane.actuators.local_state import pid_alive
from fleet.protocol.control_auth import CONTROL_TOKEN_ENV, ENGINE_API_KEY_ENV, OriginAuth, operator_auth
from fleet.protocol.keys import DEMO_API_KEY, hash_api_key
from fleet.slo.rules import rules_yaml
from fleet.spec.loader import LoadedStack, load_or_report
from fleet.spec.stack import FleetSpec, PoolSpec
from llmfleet.local.procs import Child, descendants, kill_tree, wait_http
from llmfleet.local.prometheus import LocalPrometheus
from llmfleet.local.watch import Watch, start_prometheus
from llmfleet.registries import all_registries

__all__ = ["TOKEN_FILE", "add_arguments", "banner", "run"]

TOKEN_FILE = "control-token"  # in the log dir: the fleet secret


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default="local", help="stack name or file path (default: local)")
    parser.add_argument("--port", type=int, default=None, help="gateway port (default: gateway.port, 8080)")
    parser.add_argument(
        "--admin-port", type=int, default=None, help="gateway's /readyz and /metrics (default: gateway.adminPort)"
    )
    parser.add_argument("--control-plane-port", type=int, default=None, help="default: controlPlane.port")
    parser.add_argument("--log-dir", type=Path, default=None, help="component logs (default: a temp folder)")
    parser.add_argument("--ready-timeout", type=float, default=90.0, help="seconds to wait for the fleet")
    parser.add_argument(
        "--live", action="store_true", help="refresh a view of rates, latency, errors, replicas and decisions"
    )
    parser.add_argument("--live-interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    parser.add_argument("--live-png", type=Path, default=None, help="rewrite this PNG with the live series")
    parser.add_argument("--live-png-every", type=float, default=10.0, help="seconds between PNGs (default 10)")
    parser.add_argument("--no-prometheus", action="store_true", help="do not start a local Prometheus")
    parser.add_argument("--prometheus-port", type=int, default=None, help="default: a free loopback port")


def _stack_ref(stack: str) -> str:
    path = Path(stack)
    return str(path.resolve()) if path.suffix in (".yaml", ".yml") and path.exists() else stack


def banner(
    loaded: LoadedStack, gateway: str, admin: str, control_plane: str, log_dir: Path, prometheus: str = "off"
) -> str:
    """What a newcomer needs to use the fleet right away; ``prometheus`` is its URL or why it is off."""
    spec = loaded.spec
    model = spec.pools[0].served_name
    demo = any(hash_api_key(DEMO_API_KEY) in t.api_key_hashes for t in spec.tenants)
    key = DEMO_API_KEY if demo else "<one of your tenants' keys>"
    body = f'{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "Hello!"}}]}}'
    return f"""
llmfleet is up (stack {loaded.name}): {", ".join(_pool_line(p) for p in spec.engine_pools)}
  gateway        {gateway}   (readiness, metrics: {admin})
  control plane  {control_plane}
  prometheus     {prometheus}
  API key        {key}
  model          {model}
  logs           {log_dir}

Stream a completion:
  curl -N {gateway}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{body}'

With the openai client (pip install openai):
python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{gateway}/v1", api_key="{key}")
messages = [{{"role": "user", "content": "Hello!"}}]
for chunk in client.chat.completions.create(model="{model}", messages=messages, stream=True):
    print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="", flush=True)
print()
PY

Watch it scale:  llmfleet load --rps 30 --duration 60 --gateway {gateway}
                 export {CONTROL_TOKEN_ENV}="$(cat {log_dir / TOKEN_FILE})"   # the fleet secret, for:
                 llmfleet status --control-plane {control_plane}
Ctrl-C drains and stops everything.
""".strip("\n")


def _pool_line(pool: PoolSpec) -> str:
    """``qwen-7b x1..4``, its role after it when the pool is disaggregated: ``qwen-7b (decode) x1..4``."""
    role = "" if pool.role == "aggregated" else f" ({pool.role})"
    return f"{pool.name}{role} x{pool.replicas.min}..{pool.replicas.max}"


def _pools_ready(control_plane: str, loaded: LoadedStack, auth: OriginAuth | None) -> bool:
    try:
        pools = httpx.get(f"{control_plane}/v1/pools", timeout=1.0, auth=auth).json()["pools"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    wanted = {p.name: p.replicas.min for p in loaded.spec.engine_pools}
    return all(p["ready"] >= wanted.get(p["pool"], 0) for p in pools)


@dataclass(frozen=True)
class _Layout:
    """Where each part of the local fleet listens and logs, and what every part adds to its environment."""

    stack: str
    log_dir: Path
    env: dict[str, str]
    control_plane_port: int
    gateway_port: int
    admin_port: int

    @classmethod
    def of(cls, args: argparse.Namespace, spec: FleetSpec) -> _Layout:
        # The fleet secret for control traffic, and the engines' API key: agents (started by the control plane,
        # whose environment they inherit) hand it to their engine; the gateway sends it upstream. A secret already
        # in this environment is the fleet's: operator commands run from the same shell (llmfleet rollout) hold it.
        secret = os.environ.get(CONTROL_TOKEN_ENV) or secrets.token_urlsafe(32)
        cp_port = args.control_plane_port if args.control_plane_port is not None else spec.control_plane.port
        return cls(
            stack=_stack_ref(args.stack),
            log_dir=args.log_dir or Path(tempfile.mkdtemp(prefix="llmfleet-up-")),
            env={CONTROL_TOKEN_ENV: secret, ENGINE_API_KEY_ENV: secrets.token_urlsafe(32)},
            control_plane_port=cp_port,
            gateway_port=args.port if args.port is not None else spec.gateway.port,
            admin_port=args.admin_port if args.admin_port is not None else spec.gateway.admin_port,
        )

    @property
    def control_plane(self) -> str:
        return f"http://127.0.0.1:{self.control_plane_port}"

    @property
    def auth(self) -> OriginAuth | None:
        """The fleet secret on ``up``'s own reads of the control plane (and nowhere else)."""
        return operator_auth(self.control_plane, self.env)

    def write_token(self) -> None:
        """``<log dir>/control-token``: the fleet secret, readable by this user only, for operator commands."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / TOKEN_FILE
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(self.env[CONTROL_TOKEN_ENV] + "\n")

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"


def run(args: argparse.Namespace) -> int:
    loaded = load_or_report(args.stack, registries=all_registries())
    if loaded is None:
        return 2
    at = _Layout.of(args, loaded.spec)
    at.write_token()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    children: list[Child] = []
    prometheus: LocalPrometheus | None = None
    failed = False
    try:
        _start(children, at, loaded, stop, args.ready_timeout)
        prometheus, about = start_prometheus(args, at.log_dir, at.control_plane, at.admin, rules_yaml(loaded.spec))
        print(banner(loaded, at.gateway, at.admin, at.control_plane, at.log_dir, about), flush=True)
        with Watch(args, loaded.name, at.admin, at.control_plane, prometheus, auth=at.auth) as watch:
            while not stop.wait(0.5):
                for child in children:
                    if child.process.poll() is not None:
                        raise RuntimeError(f"{child.name} exited ({child.process.returncode}):\n{child.tail()}")
                watch.tick(time.monotonic())
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        failed = True
    finally:
        if prometheus is not None and prometheus.child is not None:
            children.append(prometheus.child)  # stopped first, below: it has nothing to drain
        _stop(children, grace_s=max(p.drain.grace_seconds for p in loaded.spec.engine_pools) + 15.0)
    return 1 if failed else 0


def _start(children: list[Child], at: _Layout, loaded: LoadedStack, stop: threading.Event, timeout_s: float) -> None:
    """The control plane, its pools' minimum replicas, then the gateway, each appended to ``children`` once started;
    RuntimeError when a part does not become ready within ``timeout_s`` (or ``stop`` is set meanwhile)."""
    print(f"starting the control plane on {at.control_plane} ...", flush=True)
    argv = ["control-plane", "--stack", at.stack, "--port", str(at.control_plane_port), "--log-dir", str(at.log_dir)]
    cp = Child("control-plane", argv, at.log_dir / "control-plane.log", env=at.env)
    children.append(cp)
    deadline = time.monotonic() + timeout_s
    if not wait_http(f"{at.control_plane}/healthz", deadline, alive=cp):
        raise RuntimeError(f"the control plane did not start:\n{cp.tail()}")
    print("waiting for the pools' minimum replicas to be ready ...", flush=True)
    while not _pools_ready(at.control_plane, loaded, at.auth):
        if stop.is_set() or cp.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"replicas did not become ready (logs in {at.log_dir})")
        time.sleep(0.2)
    print(f"starting the gateway on {at.gateway} ...", flush=True)
    argv = ["gateway", "--stack", at.stack, "--port", str(at.gateway_port), "--admin-port", str(at.admin_port)]
    gw = Child("gateway", [*argv, "--control-plane", at.control_plane], at.log_dir / "gateway.log", env=at.env)
    children.append(gw)
    if not wait_http(f"{at.admin}/readyz", deadline, alive=gw):
        raise RuntimeError(f"the gateway did not become ready:\n{gw.tail()}")


def _stop(children: list[Child], grace_s: float) -> None:
    """Stop ``children`` last started first (the gateway takes no new requests, then the control plane drains its
    agents), each given ``grace_s``; then kill whatever is left of their process trees."""
    print("\nstopping: gateway, then replicas (draining), then the control plane ...", flush=True)
    tree: set[int] = set()
    for child in children:
        tree |= {child.process.pid} | descendants(child.process.pid)
    for child in reversed(children):
        child.stop(timeout_s=grace_s)
    leftovers = {pid for pid in tree if pid_alive(pid)}
    kill_tree(leftovers)
    print("stopped" + (f" ({len(leftovers)} stray process(es) killed)" if leftovers else ""), flush=True)
