"""Chaos harness: one local fleet per scenario, started part by part as ``llmfleet up`` wires it, and swept away.

A `Fleet` is the control plane (local actuator, state dir in the scenario's folder, one fleet secret) which
launches the pool's agents and their simulated engines, one or more gateways discovering replicas from it, and
optionally the quota Redis (``redis-server``) and a `Forwarder` (a round-robin TCP front for several gateways).
Every process gets ``LLMFLEET_CHAOS_RUN=<run>/<scenario>`` in its environment, which agents and engines inherit:
`sweep` kills exactly the processes carrying that marker (an engine orphaned by a killed agent included) and
nothing else on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from engine_sim.tokenizer import APPROX, SimTokenizer, load_file_tokenizer
from fleet.protocol.control_auth import (
    CONTROL_TOKEN_ENV,
    ENGINE_API_KEY_ENV,
    BearerAuth,
    ClientCredential,
    Kind,
    operator_auth,
)
from fleet.protocol.ports import free_port
from fleet.protocol.promtext import counter_value, gauge_value, parse
from llmfleet.local.procs import Child

__all__ = ["BASE", "Fleet", "Forwarder", "GatewayProc", "stack_document", "sweep"]

ROOT = Path(__file__).resolve().parents[1]
POOL = "qwen-7b"
MARKER_ENV = "LLMFLEET_CHAOS_RUN"

# The local stack (stacks/Pulumi.local.yaml) with fast simulators and short timings; scenarios override keys.
BASE: dict[str, Any] = {
    "environment": "chaos",
    "pools": [
        {
            "engine": {
                "maxNumSeqs": 16,
                "maxModelLen": 4096,
                "sim": {"gpuProfile": "a100-80gb", "startupSeconds": 0.3, "timeScale": 1.0},
            },
            "replicas": {"min": 2, "max": 2},
            "coldStartSeconds": 20,
            "slo": {"ttftP99Ms": 20000},  # the TTFT guard-rail out of the way: scaling follows the load only
            "resumeStreams": True,
            "drain": {"graceSeconds": 10, "propagationSeconds": 0.5},
        }
    ],
    "gateway": {
        "replicas": 1,
        "routing": {"staleAfterS": 2, "scrapeIntervalS": 0.25},
        "timeouts": {"firstTokenS": 10, "totalS": 60},
    },
    "autoscaling": {
        "intervalS": 0.5,
        "scaleDownStabilizationS": 3,
        "policy": {"name": "target-tracking", "params": {"releaseTimeConstantS": 0}},
    },
    "controlPlane": {"reportIntervalS": 0.25, "staleAfterS": 2},
}


def _merge(into: dict[str, Any], changes: Mapping[str, Any]) -> None:
    """Deep-merge ``changes`` into ``into``; a list of mappings merges item by item."""
    for key, value in changes.items():
        old = into.get(key)
        if isinstance(old, dict) and isinstance(value, Mapping):
            _merge(old, value)
        elif isinstance(old, list) and isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
            for i, item in enumerate(value):
                if i < len(old) and isinstance(old[i], dict):
                    _merge(old[i], item)
                else:
                    old.append(copy.deepcopy(item))
        else:
            into[key] = copy.deepcopy(value)


def stack_document(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """stacks/Pulumi.local.yaml with `BASE`, then ``overrides``, merged into its ``llmfleet:`` keys. A pool of the
    overrides with ``like: N`` is pool N as merged so far with the pool's other keys on top (a canary's twin)."""
    document = yaml.safe_load((ROOT / "stacks" / "Pulumi.local.yaml").read_text())
    config: dict[str, Any] = {k.removeprefix("llmfleet:"): v for k, v in document["config"].items()}
    _merge(config, BASE)
    _merge(config, overrides)
    pools = config["pools"]
    for i, pool in enumerate(pools):
        if "like" in pool:
            twin = copy.deepcopy(pools[pool.pop("like")])
            _merge(twin, pool)
            pools[i] = twin
    return {"config": {f"llmfleet:{k}": v for k, v in config.items()}}


def marked_pids(marker: str) -> list[int]:
    """Every process whose environment carries ``MARKER_ENV=<marker>...`` (this one excepted)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(item.startswith(needle) for item in environ):
            pids.append(int(entry.name))
    return pids


def sweep(marker: str) -> int:
    """SIGKILL every process of `marked_pids`; returns how many."""
    killed = 0
    for pid in marked_pids(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


@dataclass
class GatewayProc:
    child: Child
    port: int
    admin_port: int
    # The last figures read from its admin port (kept when the process is gone).
    resumed: dict[str, float] = field(default_factory=dict)
    quota_local: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    async def scrape(self, http: httpx.AsyncClient) -> None:
        try:
            samples = parse((await http.get(self.admin + "/metrics")).text)
        except (httpx.HTTPError, ValueError):
            return
        for outcome in ("completed", "failed"):
            with contextlib.suppress(KeyError):
                self.resumed[outcome] = counter_value(samples, "llmfleet_gateway_resumed_streams", {"outcome": outcome})
        with contextlib.suppress(KeyError):
            self.quota_local = counter_value(
                samples, "llmfleet_gateway_quota_store_down_requests", {"decision": "local"}
            )


@dataclass(frozen=True)
class Agent:
    replica: str
    pid: int
    url: str


class Fleet:
    """One scenario's processes, files in ``folder``; `close` stops and sweeps them all."""

    def __init__(self, folder: Path, marker: str, overrides: Mapping[str, Any], redis_port: int = 0) -> None:
        self.folder = folder
        self.marker = marker
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.document = stack_document(overrides)
        self.stack = folder / "Pulumi.chaos.yaml"
        self.stack.write_text(yaml.safe_dump(self.document, sort_keys=False))
        self.env = {
            CONTROL_TOKEN_ENV: secrets.token_urlsafe(32),
            ENGINE_API_KEY_ENV: secrets.token_urlsafe(32),
            MARKER_ENV: marker,
        }
        self.cp_port = free_port()
        self.control_plane: Child | None = None
        self.gateways: list[GatewayProc] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_port = redis_port
        # The fleet secret on the control plane's reads (they name engines), sent to its origin only.
        self.http = httpx.AsyncClient(timeout=2.0, trust_env=False, auth=operator_auth(self.cp_url, self.env))
        # The agents' /status names their engines: it takes a fleet member's credential, the control plane's here.
        credential = ClientCredential.from_env(Kind.CONTROL_PLANE, self.env)
        self.agent_http = httpx.AsyncClient(timeout=2.0, trust_env=False, auth=credential and BearerAuth(credential))

    @property
    def cp_url(self) -> str:
        return f"http://127.0.0.1:{self.cp_port}"

    # -- processes -----------------------------------------------------------------------------------------
    def start_redis(self) -> None:
        """``redis-server`` on ``redis_port`` (the same port when started again), no persistence."""
        self.redis_port = self.redis_port or free_port()
        argv = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(self.folder)]
        with (self.logs / "redis.log").open("ab") as log:
            self.redis = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, MARKER_ENV: self.marker},
            )

    def start_control_plane(self) -> None:
        argv = ["control-plane", "--stack", str(self.stack), "--port", str(self.cp_port)]
        argv += ["--log-dir", str(self.logs), "--state-dir", str(self.folder / "state")]
        self.control_plane = Child("control-plane", argv, self.logs / "control-plane.log", env=self.env)

    def start_gateway(self, drain_propagation_s: float = 0.0, replacing: GatewayProc | None = None) -> GatewayProc:
        """A gateway on free ports, or on those of the stopped gateway it is ``replacing`` (a rolling restart: the
        forwarder in front keeps its backends)."""
        port, admin = (free_port(), free_port()) if replacing is None else (replacing.port, replacing.admin_port)
        argv = ["gateway", "--stack", str(self.stack), "--port", str(port), "--admin-port", str(admin)]
        argv += ["--control-plane", self.cp_url, "--drain-propagation", f"{drain_propagation_s:g}"]
        name = f"gateway-{len(self.gateways)}"
        gateway = GatewayProc(Child(name, argv, self.logs / f"{name}.log", env=self.env), port, admin)
        self.gateways.append(gateway)
        return gateway

    async def until(self, what: str, predicate: Any, timeout_s: float) -> Any:
        """Poll the async ``predicate`` until it returns something truthy; RuntimeError after the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                found = await predicate()
                if found:
                    return found
            await asyncio.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what} (logs in {self.logs})")

    def engine_tokenizer(self) -> SimTokenizer:
        """The tokenizer the pool's simulated engines count prompts with (``engine.tokenizer``, from the repository
        root, where the fleet runs), else the simulator's approximate one."""
        folder = self.document["config"]["llmfleet:pools"][0].get("engine", {}).get("tokenizer")
        return APPROX if folder is None else load_file_tokenizer(Path(folder))

    async def ready_replicas(self) -> int:
        pools = (await self.http.get(self.cp_url + "/v1/pools")).json()["pools"]
        return int(pools[0]["ready"])

    async def start(self, gateways: int = 1, redis: bool = False) -> None:
        """Redis, the control plane and the gateways at once (a gateway waits for its replicas on its own); returns
        when the pool's minimum replicas are ready and every gateway routes to all of them."""
        if redis:
            self.start_redis()
        self.start_control_plane()
        # Behind the forwarder a stopping gateway keeps listening a second (gateway.drain), as behind an NLB.
        started = [self.start_gateway(1.0 if gateways > 1 else 0.0) for _ in range(gateways)]
        wanted = int(self.document["config"]["llmfleet:pools"][0]["replicas"]["min"])

        async def ready() -> bool:
            return await self.ready_replicas() >= wanted

        await self.until(f"{wanted} ready replicas", ready, 60)
        for gateway in started:
            await self.routing(gateway, wanted)

    async def routing(self, gateway: GatewayProc, replicas: int) -> None:
        """Wait until ``gateway`` routes to ``replicas`` replicas of the pool."""

        async def routable() -> bool:
            samples = parse((await self.http.get(gateway.admin + "/metrics")).text)
            return gauge_value(samples, "llmfleet_gateway_ready_replicas", {"pool": POOL}) >= replicas

        await self.until(f"{gateway.child.name} routing to {replicas} replicas", routable, 30)

    def agents(self) -> list[Agent]:
        """The agents the control plane launched (its state file), alive or not."""
        state = json.loads((self.folder / "state" / "local-agents.json").read_text())
        return [
            Agent(a["replica"], a["pid"], f"http://127.0.0.1:{a['agent_port']}")
            for a in state["agents"]
            if a["pool"] == POOL
        ]

    async def status(self, agent: Agent) -> dict[str, Any]:
        status: dict[str, Any] = (await self.agent_http.get(agent.url + "/status")).json()
        return status

    async def scrape(self) -> None:
        for gateway in self.gateways:
            if gateway.child.process.poll() is None:
                await gateway.scrape(self.http)

    async def json(self, path: str) -> Any:
        return (await self.http.get(self.cp_url + path)).json()

    # -- teardown ------------------------------------------------------------------------------------------
    async def close(self) -> None:
        """SIGKILL everything this fleet started (the marker finds agents and engines in sessions of their own):
        the figures are taken, and an orderly stop is not what is measured."""
        with contextlib.suppress(Exception):
            await self.http.aclose()
            await self.agent_http.aclose()
        sweep(self.marker)
        for child in [g.child for g in self.gateways] + ([self.control_plane] if self.control_plane else []):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(child.kill)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.kill()
                self.redis.wait(timeout=5)


class Forwarder:
    """Round-robin TCP front for several gateways (an L4 load balancer): each client connection goes to the next
    backend that accepts a TCP connection; a refused one is skipped. Connections are never moved once made."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = 0
        self._next = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.refused = 0  # connections a backend refused (then tried on the next one)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.port = free_port()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, backlog=1024)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for _ in range(len(self.backends)):
            port = self.backends[self._next % len(self.backends)]
            self._next += 1
            try:
                upstream = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                self.refused += 1
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
