"""CLI: ``llmfleet agent --stack NAME --pool POOL --port PORT``, the replica's entrypoint (by hand or in a pod).

The stack (a name under stacks/ or a path to a stack file) is loaded and validated once; the pool's spec
decides the engine command line, probes, drain timings and restart window. SIGTERM and SIGINT start a drain;
the process exits 0 once the engine has stopped. With a model bucket (``--model-bucket``, by default
``$LLMFLEET_MODEL_BUCKET``, which engine pods get from the stack) the agent first fetches the pool's model into
``--model-cache`` (`agent.model_store`); without one the engine loads the model itself, as before.

Credentials come from the environment, never the command line: the control credential
(``$LLMFLEET_CONTROL_TOKEN`` or the projected token at ``$LLMFLEET_CONTROL_TOKEN_FILE``) goes on the agent's
reports and lease calls, and only to the control plane's origin; the engine key (``$LLMFLEET_ENGINE_API_KEY``) goes
to the engine (as ``$VLLM_API_KEY``) and on the agent's own calls to it. ``--auth`` (as the control plane's) decides
who may drain or reset this agent: with no credential and no explicit ``--auth none`` the agent exits 2 before
starting anything (`fleet.protocol.control_auth.resolve_mode`). ``--prestop-from`` adds addresses allowed to call
``/prestop`` without one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from agent.launchers import REGISTRY as LAUNCHERS, LaunchConfig, make_launcher
from agent.launchers.kv_transfer import SideChannel
from agent.model_store import StoreOptions
from agent.node import Agent, AgentOptions, reachable
from agent.restarts import RestartPolicy
from agent.supervisor import SupervisorSettings
from fleet.protocol.control_auth import (
    AUTH_MODES,
    ENGINE_API_KEY_ENV,
    ClientCredential,
    ControlAuth,
    Kind,
    OriginAuth,
    client_credential,
    make_verifier,
    resolve_mode,
)
from fleet.protocol.model_manifest import ModelKeys
from fleet.protocol.ports import free_port
from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from fleet.spec.stack import FleetSpec

__all__ = ["POD_IP_ENV", "add_arguments", "run", "side_channel"]

POD_IP_ENV = "POD_IP"  # the pod's address, from the downward API (status.podIP) on a cluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<name>.yaml) or a file path")
    parser.add_argument("--pool", required=True, help="the pool this replica belongs to")
    parser.add_argument("--port", type=int, required=True, help="port of the agent's own API")
    parser.add_argument("--host", default="127.0.0.1", help="interface of the agent's API (default 127.0.0.1)")
    parser.add_argument("--replica", help="replica id (default: <hostname>-<port>)")
    parser.add_argument("--control-plane", help="control plane URL, or 'none' (default: from the stack)")
    parser.add_argument("--engine-port", type=int, help="engine port (default: a free port)")
    parser.add_argument("--kv-events-port", type=int, help="engine.kvEvents: the events' port (default: a free port)")
    parser.add_argument("--engine-host", help="engine interface (default: same as --host)")
    side = "P/D pools: NIXL's handshake port (default: a free one locally, else disaggregation.sideChannelPort)"
    parser.add_argument("--side-channel-port", type=int, help=side)
    parser.add_argument("--advertise-host", help="host name others use to reach this node's engine and agent")
    parser.add_argument("--log-dir", type=Path, help="engine log folder (default: a temp folder per replica)")
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra engine argument, repeatable (e.g. --engine-arg=--fault-hang)",
    )
    store = parser.add_argument_group("model store")
    store.add_argument(
        "--model-bucket",
        default=os.environ.get("LLMFLEET_MODEL_BUCKET"),
        metavar="BUCKET",
        help="fetch the model from this bucket first (default: $LLMFLEET_MODEL_BUCKET; unset or 'none': do not)",
    )
    store.add_argument(
        "--model-cache",
        type=Path,
        default=Path(os.environ.get("LLMFLEET_MODEL_CACHE") or Path(tempfile.gettempdir()) / "llmfleet" / "models"),
        metavar="DIR",
        help="node cache folder for fetched models (default: $LLMFLEET_MODEL_CACHE, else a temp folder)",
    )
    tuning = parser.add_argument_group("probes and restarts")
    defaults, policy = SupervisorSettings(), RestartPolicy()
    tuning.add_argument("--probe-interval", type=float, default=defaults.probe_interval_s, metavar="S")
    tuning.add_argument("--liveness-failures", type=int, default=defaults.liveness_failures, metavar="N")
    tuning.add_argument("--max-restarts", type=int, default=policy.max_restarts, metavar="N")
    tuning.add_argument("--crash-window", type=float, default=policy.window_s, metavar="S")
    tuning.add_argument("--backoff-base", type=float, default=policy.backoff_base_s, metavar="S")
    tuning.add_argument("--backoff-max", type=float, default=policy.backoff_max_s, metavar="S")
    tuning.add_argument("--lease-retry", type=float, default=defaults.lease_retry_s, metavar="S")
    tuning.add_argument("--report-backoff-max", type=float, default=10.0, metavar="S")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument(
        "--auth",
        choices=AUTH_MODES,
        default=None,
        help="who may drain or reset this agent (default as the control plane's; with no credential, give --auth none "
        "to run open)",
    )
    parser.add_argument(
        "--prestop-from",
        action="append",
        default=[],
        metavar="ADDR",
        help="an address allowed to call /prestop without a credential (the node's, for the kubelet; repeatable)",
    )


def http_auth(options: AgentOptions, env: Mapping[str, str]) -> OriginAuth:
    """The control credential for the control plane's origin, the engine key for the engine's; nothing elsewhere."""
    tokens: dict[str, Callable[[], str]] = {}
    credential = ClientCredential.from_env(Kind.AGENT, env)
    if options.control_plane and credential is not None:
        tokens[options.control_plane] = credential.token
    engine_key = env.get(ENGINE_API_KEY_ENV)
    if engine_key:
        local = "127.0.0.1" if options.engine_host in ("0.0.0.0", "::", "") else options.engine_host
        tokens[f"http://{local}:{options.engine_port}"] = lambda: engine_key
    return OriginAuth(tokens)


def control_plane_url(spec: FleetSpec, flag: str | None) -> str | None:
    """--control-plane, else the stack's controlPlane.url, else loopback for a local stack; 'none' disables."""
    if flag is not None:
        return None if flag.lower() == "none" else flag
    if spec.control_plane.url:
        return spec.control_plane.url
    if spec.target == "local":
        return f"http://127.0.0.1:{spec.control_plane.port}"
    return None


def build_options(args: argparse.Namespace, spec: FleetSpec) -> AgentOptions:
    engine_host = args.engine_host or args.host
    replica = args.replica or f"{socket.gethostname()}-{args.port}"
    log_dir = args.log_dir or Path(tempfile.gettempdir()) / "llmfleet" / "agents" / replica
    settings = SupervisorSettings(
        probe_interval_s=args.probe_interval,
        liveness_failures=args.liveness_failures,
        restart=RestartPolicy(
            max_restarts=args.max_restarts,
            window_s=args.crash_window,
            backoff_base_s=args.backoff_base,
            backoff_max_s=args.backoff_max,
        ),
        lease_retry_s=args.lease_retry,
    )
    return AgentOptions(
        replica=replica,
        port=args.port,
        engine_port=args.engine_port or free_port(engine_host if engine_host != "0.0.0.0" else "127.0.0.1"),
        host=args.host,
        engine_host=engine_host,
        advertise_host=args.advertise_host,
        control_plane=control_plane_url(spec, args.control_plane),
        log_path=log_dir / "engine.log",
        engine_args=tuple(args.engine_arg),
        settings=settings,
        report_interval_s=spec.control_plane.report_interval_s,
        report_backoff_max_s=args.report_backoff_max,
        model_store=store_options(args, spec),
        kv_events_port=args.kv_events_port
        or (free_port("127.0.0.1") if spec.pool(args.pool).engine.kv_events else None),
        side_channel=side_channel(args, spec, os.environ),
    )


def side_channel(args: argparse.Namespace, spec: FleetSpec, env: Mapping[str, str]) -> SideChannel | None:
    """A prefill or decode pool's NIXL side channel: the pod's address (``$POD_IP``, which pods get from the
    downward API, else the address the agent advertises the engine at) and ``--side-channel-port``, else a free port
    on a local stack (its engines share one host), else the stack's ``sideChannelPort``. None for an aggregated
    pool."""
    pool = spec.pool(args.pool)
    if pool.disaggregation is None:
        return None
    host = env.get(POD_IP_ENV) or reachable(args.engine_host or args.host, args.advertise_host)
    port = args.side_channel_port
    if port is None:
        port = free_port("127.0.0.1") if spec.target == "local" else pool.disaggregation.side_channel_port
    return SideChannel(host, port)


def store_options(args: argparse.Namespace, spec: FleetSpec) -> StoreOptions | None:
    """The model store from --model-bucket and the stack's ``modelStore``; None without a bucket."""
    if not args.model_bucket or args.model_bucket.lower() == "none":
        return None
    return StoreOptions(
        bucket=args.model_bucket,
        prefix=spec.model_store.prefix,
        cache_dir=args.model_cache,
        hub_fallback=spec.model_store.hub_fallback,
        region=spec.region if spec.target == "aws" else None,
        concurrency=spec.model_store.concurrency,
        part_size=spec.model_store.part_size_mib * 1024 * 1024,
    )


async def _serve(agent: Agent) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.supervisor.request_drain)
    return await agent.serve()


def run(args: argparse.Namespace) -> int:
    try:
        stack = load_spec(args.stack, registries=[LAUNCHERS])
        pool = stack.spec.pool(args.pool)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"llmfleet agent: {exc.args[0]}", file=sys.stderr)
        return 2
    options = build_options(args, stack.spec)
    try:
        config = LaunchConfig(options.engine_host, options.engine_port, extra_args=options.engine_args)
        make_launcher(pool, config).argv()
        if options.model_store is not None:
            ModelKeys(options.model_store.prefix, pool.model, pool.model_revision)
        auth = ControlAuth(make_verifier(resolve_mode(args.auth)))
        if options.control_plane:  # what it presents to the control plane: a token file that is not there stops it
            client_credential(Kind.AGENT, args.auth)
    except ValueError as exc:  # no credential, or an engine command line that could never start: fail before spawning
        print(f"llmfleet agent: {exc}", file=sys.stderr)
        return 2

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s agent %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe is noise

    if auth.verifier is None:
        logging.getLogger("llmfleet.agent").warning("control auth is OFF: anyone reaching the agent can drain it")

    async def main() -> int:
        async with httpx.AsyncClient(trust_env=False, auth=http_auth(options, os.environ)) as http:
            agent = Agent(pool, options, http, api_auth=auth, prestop_from=args.prestop_from)
            return await _serve(agent)

    return asyncio.run(main())
