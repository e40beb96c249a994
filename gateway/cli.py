"""CLI: ``llmfleet gateway --stack NAME --port PORT [--admin-port PORT] [--host H] [--replica [POOL=]URL ...]
[--control-plane URL] [--tls-cert PEM --tls-key PEM] [--model-bucket B] [--tokenizer-cache DIR]``.

Keys come from three places:
* tenants' ``apiKeyHashes`` in the stack file;
* ``<--secrets-dir>/tenant-keys.json``, ``{tenant: ["sha256:..."]}``: the Secret the Pulumi program renders from
  tenants' ``apiKeysSecret`` (only digests reach the cluster), re-read when it changes (`gateway.auth.KeyHashesFile`:
  a revoked key is refused within the kubelet's Secret sync plus 5 s, without a restart);
* for a tenant naming an ``apiKeysSecret``, plain keys in the env var ``LLMFLEET_SECRET_<SECRET>`` (e.g.
  ``tenantKeys:acme`` -> ``LLMFLEET_SECRET_TENANTKEYS_ACME``) or the file ``<--secrets-dir>/<secret, ':' as '_'>``
  (a JSON list, or one key per line), hashed at startup.
The quota Redis (``quotaBackend: redis``) is ``$LLMFLEET_REDIS_URL`` when set, else the stack's ``redisUrl``.
The local stack's demo tenant key ``sk-llmfleet-demo`` is in its stack file as a hash and works on that stack only.

On start it prints two lines to stdout: ``llmfleet gateway admin (readiness, metrics) on http://HOST:PORT`` (the
admin listener: /healthz, /readyz, /metrics, plain HTTP), then ``llmfleet gateway listening on http://HOST:PORT``
(the public one: the OpenAI API and /healthz). SIGTERM or SIGINT drains (`gateway.drain`): readiness falls and
every response says ``Connection: close``; with ``--drain-propagation S`` (the Pulumi program sets
``gateway.drain.propagationSeconds``) it keeps listening S seconds while load balancers notice, then stops
accepting and serves the connections it has until each is closed by a ``Connection: close`` response or, idle, after
a 1 s grace (also with no propagation delay, as when started by hand); in-flight requests get --shutdown-timeout
(the rest of ``gateway.drain``'s grace); it exits 0.

With a model bucket (``--model-bucket``, default ``$LLMFLEET_MODEL_BUCKET``, which gateway pods get from the stack)
the gateway fetches, before it listens, the tokenizer of each pool routed by ``kv-cache`` whose engine publishes KV
events and names no ``engine.tokenizer`` folder, into ``--tokenizer-cache`` (`gateway.tokenizer_store`); a pool
whose tokenizer cannot be fetched is routed without kv-cache, with a warning.

With a control plane (``--control-plane``, or the stack's ``controlPlane.url``) the gateway presents a control
credential on its reports and on its discovery and alias reads (`fleet.protocol.control_auth.client_credential`):
``$LLMFLEET_CONTROL_TOKEN`` (``--auth shared-secret``) or the projected token at ``$LLMFLEET_CONTROL_TOKEN_FILE``
(``--auth kubernetes``); with neither it exits 2 unless ``--auth none`` says to call without one. A gateway with
static replicas only talks to no control plane and needs no credential.

With ``gateway.tracing.otlpEndpoint`` set, request spans go to that collector over OTLP/HTTP in batches (the
``otlp`` extra; exit 2 when it is missing), and the batch left at shutdown is sent before exiting.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import ssl
import sys
import tempfile
from collections import defaultdict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from fleet.protocol import contract
from fleet.protocol.control_auth import AUTH_MODES, Kind, client_credential
from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from fleet.spec.stack import FleetSpec
from fleet.tokenizer import ModelTokenizer
from gateway.app import create_admin_app, create_app
from gateway.auth import KEY_HASHES_FILE, KeyHashesFile, keys_from_secret
from gateway.drain import Drain
from gateway.edge import EdgeRunner
from gateway.routing import REGISTRIES as ROUTING_REGISTRIES
from gateway.settings import GatewaySettings
from gateway.tokenizer_store import TokenizerSource, store_tokenizers
from gateway.tracing import TracingUnavailable, provider_for

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default="local", help="stack name (stacks/Pulumi.NAME.yaml) or path")
    parser.add_argument(
        "--host", default=None, help="listen address (default: 127.0.0.1 on target local, 0.0.0.0 elsewhere)"
    )
    parser.add_argument("--port", type=int, default=None, help="default: the stack's gateway.port; 0 picks one")
    parser.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help="port of /readyz and /metrics (default: the stack's gateway.adminPort; 0 with --port 0)",
    )
    parser.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="[POOL=]URL",
        help="a static engine URL (repeatable); POOL defaults to the stack's first pool",
    )
    parser.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="[POOL=]URL",
        help="the KV event socket (tcp://host:port) of the pool's static replica of the same position (repeatable)",
    )
    parser.add_argument(
        "--secrets-dir",
        type=Path,
        default=Path("/etc/llmfleet/secrets"),
        help="directory holding tenants' apiKeysSecret files",
    )
    parser.add_argument("--no-access-log", action="store_true", help="do not write JSON access log lines")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0)
    parser.add_argument(
        "--drain-propagation",
        type=float,
        default=0.0,
        help="seconds to keep listening after SIGTERM, with readiness down, while load balancers notice (default 0)",
    )
    parser.add_argument("--tls-cert", type=Path, default=None, help="serve HTTPS: PEM certificate chain")
    parser.add_argument("--tls-key", type=Path, default=None, help="serve HTTPS: PEM private key of --tls-cert")
    parser.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="event loop: uvloop when installed (auto), or the standard one",
    )
    _control_arguments(parser)
    _store_arguments(parser)
    parser.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)


def _control_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the control plane is, and the credential the gateway presents to it."""
    parser.add_argument(
        "--control-plane",
        default=None,
        metavar="URL",
        help="discover replicas from the control plane (default: the stack's controlPlane.url)",
    )
    parser.add_argument(
        "--auth",
        choices=AUTH_MODES,
        default=None,
        help="the credential on control-plane calls: $LLMFLEET_CONTROL_TOKEN (shared-secret), "
        "$LLMFLEET_CONTROL_TOKEN_FILE (kubernetes) or none (default: whichever is set; with a control plane and "
        "neither, give --auth none to call it without one)",
    )


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    """Where tokenizers come from on a cluster: the model bucket, and the folder they are cached in."""
    parser.add_argument(
        "--model-bucket",
        default=os.environ.get(contract.MODEL_BUCKET_ENV),
        help="fetch pools' tokenizers from this bucket (default: $LLMFLEET_MODEL_BUCKET; unset or 'none': do not)",
    )
    parser.add_argument(
        "--tokenizer-cache",
        type=Path,
        default=Path(os.environ.get(contract.TOKENIZER_CACHE_ENV) or Path(tempfile.gettempdir(), "llmfleet-tok")),
        help="folder for the tokenizers fetched from the model bucket (default: $LLMFLEET_TOKENIZER_CACHE, else "
        "llmfleet-tok in the temporary folder)",
    )


def _settings(args: argparse.Namespace) -> GatewaySettings:
    loaded = load_spec(args.stack, registries=ROUTING_REGISTRIES)
    spec = loaded.spec
    static: dict[str, list[str]] = defaultdict(list)
    for item in args.replica:
        pool, sep, url = item.partition("=")
        if not sep or "://" in pool:
            pool, url = spec.pools[0].name, item
        spec.pool(pool)  # KeyError lists the pools
        static[pool].append(url)
    kv_events: dict[str, list[str]] = defaultdict(list)
    for item in args.kv_events:
        pool, sep, url = item.partition("=")
        if not sep or "://" in pool:
            pool, url = spec.pools[0].name, item
        spec.pool(pool)
        kv_events[pool].append(url)
    # Re-read when the mounted Secret changes: a revoked key is refused without a restart (gateway.auth).
    hashes = KeyHashesFile(args.secrets_dir / KEY_HASHES_FILE)
    extra: dict[str, list[str]] = {}
    for tenant in spec.tenants:
        if tenant.api_keys_secret:
            keys = keys_from_secret(tenant.api_keys_secret, os.environ, args.secrets_dir)
            if keys:
                extra[tenant.name] = keys
            elif not tenant.api_key_hashes and not hashes.get(tenant.name):
                logging.getLogger("llmfleet.gateway").warning(
                    "tenant %s has no keys: secret %s not found", tenant.name, tenant.api_keys_secret
                )
    control_plane = args.control_plane or spec.control_plane.url
    return GatewaySettings(
        spec=spec,
        extra_hashes=hashes,
        static_replicas=dict(static),
        static_kv_events=dict(kv_events),
        control_plane=control_plane,
        extra_keys=extra,
        access_log=not args.no_access_log,
        routing_seed=args.seed,
        redis_url=os.environ.get(contract.REDIS_URL_ENV) or None,
        # With a control plane, no credential and no --auth none is exit 2; static replicas alone need none.
        control_credential=client_credential(Kind.GATEWAY, args.auth) if control_plane else None,
        engine_api_key=GatewaySettings.engine_api_key_from(os.environ),
        tokenizers=_store_tokenizers(args, spec),
    )


def _store_tokenizers(args: argparse.Namespace, spec: FleetSpec) -> dict[str, ModelTokenizer]:
    """The pools' tokenizers from the model bucket, when there is one (blocking: before the event loop starts)."""
    if not args.model_bucket or args.model_bucket.lower() == "none":
        return {}
    region = spec.region if spec.target == "aws" else None
    source = TokenizerSource(args.model_bucket, spec.model_store.prefix, args.tokenizer_cache, region)
    return store_tokenizers(spec, source)


def _tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """A server context (TLS 1.2 or later) for --tls-cert/--tls-key; None without them; ValueError for one alone."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load --tls-cert {cert} / --tls-key {key}: {exc}") from exc
    return context


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound here, so that port 0 can be reported."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def _serve(
    settings: GatewaySettings,
    host: str,
    ports: tuple[int, int],
    drain: tuple[float, float],
    tls: ssl.SSLContext | None,
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Serve the public application on ``ports[0]`` and the admin one on ``ports[1]`` until SIGTERM/SIGINT, then
    drain it (`gateway.drain`); ``drain``: the propagation delay and the shutdown timeout, seconds."""
    app = create_app(settings, tracer_provider=tracer_provider)
    draining = Drain(propagation_s=drain[0], shutdown_s=drain[1])
    draining.install(app)
    # Both listeners close a connection whose headers or body stall and answer malformed HTTP with a 4xx (gateway.edge)
    timeouts = settings.spec.gateway.timeouts
    runner = EdgeRunner(
        app, timeouts, handler_cancellation=True, access_log=None, shutdown_timeout=draining.runner_timeout_s
    )
    await runner.setup()
    admin = EdgeRunner(create_admin_app(app), timeouts, access_log=None, shutdown_timeout=1.0)
    await admin.setup()
    admin_sock = _bind(host, ports[1])
    await web.SockSite(admin, admin_sock).start()
    print(f"llmfleet gateway admin (readiness, metrics) on http://{host}:{admin_sock.getsockname()[1]}", flush=True)
    sock = _bind(host, ports[0])
    site = web.SockSite(runner, sock, backlog=1024, ssl_context=tls)
    await site.start()
    scheme = "https" if tls is not None else "http"
    print(f"llmfleet gateway listening on {scheme}://{host}:{sock.getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await draining.run(runner)  # the admin listener answers (readiness down) until the public one has drained
    await admin.cleanup()
    if tracer_provider is not None:  # sends the spans still batched (a blocking HTTP call)
        await asyncio.to_thread(tracer_provider.shutdown)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    access = logging.getLogger("llmfleet.gateway.access")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False
    try:
        settings = _settings(args)
        tls = _tls_context(args.tls_cert, args.tls_key)
        tracer_provider = provider_for(settings.spec.gateway.tracing)
    except (SpecError, KeyError, ValueError, TracingUnavailable) as exc:
        print(f"llmfleet gateway: {exc}", file=sys.stderr)
        return 2
    if settings.control_plane and settings.control_credential is None:
        logging.getLogger("llmfleet.gateway").warning(
            "control auth is OFF (--auth none): control-plane calls carry no credential"
        )
    port = settings.spec.gateway.port if args.port is None else args.port
    admin_port = args.admin_port
    if admin_port is None:
        admin_port = 0 if port == 0 else settings.spec.gateway.admin_port
    if admin_port == port != 0:
        print(f"llmfleet gateway: the admin port must differ from the public port {port}", file=sys.stderr)
        return 2
    host = args.host or ("127.0.0.1" if settings.spec.target == "local" else "0.0.0.0")
    if args.drain_propagation < 0:
        print(f"llmfleet gateway: --drain-propagation {args.drain_propagation}: give 0 or more", file=sys.stderr)
        return 2
    drain = (args.drain_propagation, args.shutdown_timeout)
    _run_loop(args.loop, _serve(settings, host, (port, admin_port), drain, tls, tracer_provider))
    return 0


def _run_loop(choice: str, main: Coroutine[Any, Any, None]) -> None:
    """uvloop, when installed, cuts the gateway's CPU per request (bench/gateway_overhead.py measures it)."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            uvloop.run(main)
            return
    asyncio.run(main)
