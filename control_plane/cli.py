"""CLI: ``llmfleet control-plane --stack NAME --port PORT [--host H] [--dry-run]``.

Serves the control-plane API (FastAPI on uvicorn, in this process's event loop) and runs the autoscaling loop
with the stack's actuator. On start it prints one line, ``llmfleet control-plane listening on http://HOST:PORT``
with the port actually bound (``--port 0`` picks a free one), to stdout; agents it launches are told that port
too unless ``--url`` or ``controlPlane.url`` says otherwise. SIGINT or SIGTERM stops the loop, then closes the
actuator (the local actuator drains and stops every agent it started), then the HTTP server.

**Restarts** (docs/operations.md, "Control plane restart"). Before serving, the restart leases are loaded from the
actuator's lease store (`control_plane.leases.stores`: Lease objects on a cluster, ``<state dir>/leases.json``
locally), the canary rollouts from the same kind of store (`control_plane.rollout_stores`) and the local actuator
adopts the agents recorded in ``<state dir>/local-agents.json``. ``--state-dir`` defaults to ``--log-dir`` (where
``llmfleet up`` keeps the fleet's files); with neither, nothing persists. No pool is scaled or listed to gateways
until the agents alive have reported (`control_plane.startup`).

**Error budgets** (docs/operations.md, "Error budget") are counted from the admin /metrics of the gateways that
report (in memory, since this process started), or read from a Prometheus with ``--prometheus URL``.

``--auth none|shared-secret|kubernetes`` chooses how callers are authenticated (`fleet.protocol.control_auth`): writes
and the ``/v1`` reads (which name engines) need a credential; ``/healthz`` and ``/metrics`` stay open. The default is
shared-secret when ``$LLMFLEET_CONTROL_TOKEN`` is set, else kubernetes in a cluster; with neither it exits 2 naming
them: a control plane runs open only with an explicit ``--auth none``, which logs a warning (then anyone who reaches
the port can register an engine and list every engine's address).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

import httpx

from control_plane.actuators import ActuatorEnv, build_actuator
from control_plane.api.app import create_app
from control_plane.budget.sources import make_source
from control_plane.leases.stores import LeaseStoreError, build_lease_store
from control_plane.plane import ControlPlane
from control_plane.plugins import REGISTRIES
from control_plane.rollout_stores import build_rollout_store
from control_plane.startup import hold_for
from fleet.protocol.clock import SystemClock
from fleet.protocol.control_api import ApiServer, bind
from fleet.protocol.control_auth import AUTH_MODES, ControlAuth, make_verifier, resolve_mode
from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec

__all__ = ["add_arguments", "run"]

log = logging.getLogger("llmfleet.autoscaler")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name (local, dev, ...) or path to a stack file")
    parser.add_argument("--port", type=int, default=None, help="listen port (default: controlPlane.port; 0 picks one)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--url", default=None, help="URL agents use to reach this control plane")
    parser.add_argument("--dry-run", action="store_true", help="log scaling decisions without acting on them")
    parser.add_argument("--actuator", default=None, help="override autoscaling.actuator")
    parser.add_argument("--log-dir", type=Path, default=None, help="where local agents write their logs")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where a local control plane keeps leases and launched agents across restarts (default: --log-dir)",
    )
    parser.add_argument(
        "--auth",
        choices=AUTH_MODES,
        default=None,
        help="how callers are authenticated (default: shared-secret with $LLMFLEET_CONTROL_TOKEN, kubernetes in a "
        "cluster; with neither, give --auth none to run open)",
    )
    parser.add_argument(
        "--prometheus",
        default=None,
        metavar="URL",
        help="read the error budgets from this Prometheus (default: count the reporting gateways' /metrics)",
    )
    parser.add_argument(
        "--nodegroup",
        action="append",
        default=[],
        type=_nodegroup,
        metavar="GROUP:ZONE=NAME",
        help="the EKS node group of a GPU group in a zone (the aws actuator; repeatable, rendered by the program)",
    )


def _nodegroup(text: str) -> tuple[tuple[str, str], str]:
    key, sep, name = text.partition("=")
    group, colon, zone = key.partition(":")
    if not (sep and colon and group and zone and name):
        raise argparse.ArgumentTypeError(f"expected GROUP:ZONE=NAME, got {text!r}")
    return (group, zone), name


def _stack_ref(stack: str) -> str:
    """Agents get the same stack; a file path is made absolute so it works from any directory."""
    path = Path(stack)
    return str(path.resolve()) if path.suffix in (".yaml", ".yml") and path.exists() else stack


async def serve(args: argparse.Namespace) -> int:
    loaded = load_spec(args.stack, registries=REGISTRIES)
    spec = loaded.spec
    mode = resolve_mode(args.auth)  # before anything starts: no credential and no --auth none is exit 2
    auth = ControlAuth(make_verifier(mode))
    if auth.verifier is None:
        log.warning("control auth is OFF (--auth none): anyone reaching this port can register engines and leases")
    port = args.port if args.port is not None else spec.control_plane.port
    sock = bind(args.host, port)  # bound before anything else so that port 0 is known to agents and printed
    port = sock.getsockname()[1]
    url_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = args.url or spec.control_plane.url or f"http://{url_host}:{port}"
    env = ActuatorEnv(
        stack=_stack_ref(args.stack),
        control_plane_url=url,
        log_dir=args.log_dir,
        state_dir=args.state_dir or args.log_dir,
        auth=mode,
        nodegroups=dict(args.nodegroup),
    )
    actuator_name = args.actuator or spec.autoscaling.actuator
    actuator = build_actuator(spec, env, name=actuator_name, dry_run=True if args.dry_run else None)
    store = build_lease_store(spec, env, actuator_name)
    source = None
    if args.prometheus is not None:
        source = make_source("prometheus", {"url": args.prometheus}, httpx.AsyncClient())
    clock = SystemClock()
    cp = ControlPlane.build(spec, clock, actuator, store=store, budget_source=source, startup_hold_s=hold_for(spec))
    try:
        restored = await cp.leases.restore(clock.time())
        log.info("restart leases in %s: %d held", store.where(), restored)
    except LeaseStoreError as exc:  # lease calls answer 503 and retry the load until it succeeds
        log.error("restart leases could not be loaded from %s: %s", store.where(), exc)
    await cp.restore_rollouts(build_rollout_store(spec, env, actuator_name))
    server = ApiServer(create_app(cp, auth), sock)
    await server.start()
    log.info(
        "control plane for stack %s on %s (actuator %s%s, auth %s)",
        loaded.name,
        url,
        spec.autoscaling.actuator,
        ", dry-run" if args.dry_run or spec.autoscaling.dry_run else "",
        mode,
    )
    print(f"llmfleet control-plane listening on http://{args.host}:{port}", flush=True)

    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    task = asyncio.create_task(cp.run())
    await stopping.wait()
    log.info("stopping: draining replicas")
    cp.stop()
    with contextlib.suppress(Exception):
        await task
    await actuator.close()
    await server.stop()
    await store.close()
    await cp.close()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return asyncio.run(serve(args))
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ValueError as exc:  # no credential, or an --auth mode without its own
        print(f"llmfleet control-plane: {exc}", file=sys.stderr)
        return 2
