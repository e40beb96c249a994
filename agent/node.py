"""Node: one replica's agent assembled from its parts (launcher, supervisor, reporter, HTTP API).

`Agent` owns the wiring only: it builds the engine launcher from the pool spec, hands the supervisor its
injected edges, exposes the replica's status and load report, and runs the API server, the reporter and
the supervisor together until the supervisor stops. Exit code 0 after a drain. With a model store
(``AgentOptions.model_store``) the supervisor first fetches the weights (`agent.model_store`, in a worker thread)
and the launcher then loads the local copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent.api import create_app
from agent.control import ControlClient
from agent.engine_client import HttpEngineClient, version_matches
from agent.gpus import device_of, query_gpus
from agent.launchers import EngineProcess, LaunchConfig, make_launcher
from agent.launchers.kv_transfer import SideChannel
from agent.metrics import AgentMetrics
from agent.model_store import FetchResult, ModelFetcher, StoreOptions
from agent.reporter import Load, Reporter
from agent.starts import StartRecorder
from agent.states import Event, State, Transition
from agent.status import AgentStatus, ControlPlaneLink, EngineInfo, LoadInfo, ModelStoreInfo, TransitionInfo
from agent.supervisor import Supervisor, SupervisorSettings
from fleet.protocol.clock import Clock, SystemClock
from fleet.protocol.control_api import ApiServer, bind
from fleet.protocol.control_auth import ControlAuth
from fleet.protocol.model_manifest import ModelKeys
from fleet.protocol.wire import LoadReport
from fleet.spec.stack import PoolSpec

__all__ = ["Agent", "AgentOptions", "reachable"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentOptions:
    replica: str
    port: int  # the agent's own API
    engine_port: int
    host: str = "127.0.0.1"
    engine_host: str = "127.0.0.1"
    advertise_host: str | None = None  # how others reach this node (default: host, or the hostname)
    control_plane: str | None = None
    log_path: Path | None = None
    engine_args: Sequence[str] = ()
    settings: SupervisorSettings = field(default_factory=SupervisorSettings)
    report_interval_s: float = 1.0
    report_backoff_max_s: float = 10.0
    model_store: StoreOptions | None = None  # None: the engine loads the model itself (local stacks)
    kv_events_port: int | None = None  # engine.kvEvents: where the engine publishes its KV-cache events
    side_channel: SideChannel | None = None  # a prefill or decode pool's engine: its NIXL handshake listener


def _launch_config(pool: PoolSpec, options: AgentOptions) -> LaunchConfig:
    return LaunchConfig(
        host=options.engine_host,
        port=options.engine_port,
        log_path=options.log_path,
        extra_args=tuple(options.engine_args),
        kv_events_port=options.kv_events_port if pool.engine.kv_events else None,
        replica=options.replica,
        side_channel=options.side_channel if pool.role != "aggregated" else None,
    )


def reachable(host: str, advertise: str | None) -> str:
    """How others reach what binds ``host``: the advertised name, else ``host`` unless a wildcard (the hostname)."""
    if advertise:
        return advertise
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


class Agent:
    def __init__(
        self,
        pool: PoolSpec,
        options: AgentOptions,
        http: httpx.AsyncClient,
        clock: Clock | None = None,
        s3: Any = None,
        api_auth: ControlAuth | None = None,
        prestop_from: Sequence[str] = (),
        gpu_query: Callable[[], Awaitable[list[dict[str, str]]]] = query_gpus,
    ) -> None:
        """``s3``: the model store's boto3 S3 client (default: one from boto3's own settings, when there is a
        store). ``api_auth`` guards the agent's API (None: open) and ``prestop_from`` lists the addresses that may
        call ``/prestop`` without a credential (`agent.api`). ``gpu_query`` lists the node's GPUs (`agent.gpus`):
        none, and the engine runs on the CPU (`find_device`)."""
        self.pool = pool
        self.api_auth = api_auth
        self.prestop_from = tuple(prestop_from)
        self.options = options
        self.clock = clock or SystemClock()
        store = options.model_store
        self.metrics = AgentMetrics(options.replica, pool.name, State.STARTING if store is None else State.FETCHING)
        self.launch_config = _launch_config(pool, options)
        self.launcher = make_launcher(pool, self.launch_config)
        self.fetcher, self.adapter_fetchers = _fetchers(pool, store, s3, self.metrics)
        self.starts = StartRecorder(self.metrics.start_phase, self.clock.monotonic)
        self.fetched: FetchResult | None = None
        local_host = "127.0.0.1" if options.engine_host in ("0.0.0.0", "::", "") else options.engine_host
        self.engine_client = HttpEngineClient(
            http, f"http://{local_host}:{options.engine_port}", pool.served_name, probe_timeout_s=5.0
        )
        self.engine_url = f"http://{reachable(options.engine_host, options.advertise_host)}:{options.engine_port}"
        self.agent_url = f"http://{reachable(options.host, options.advertise_host)}:{options.port}"
        self.control = ControlClient(http, options.control_plane)
        self.supervisor = Supervisor(
            pool,
            options.replica,
            spawn=self._spawn,
            engine_client=self.engine_client,
            control=self.control,
            clock=self.clock,
            metrics=self.metrics,
            settings=options.settings,
            fetch=self._fetch if self.fetcher is not None else None,
        )
        self.reporter = Reporter(
            lambda: self.engine_client if self.supervisor.engine is not None else None,
            self.control,
            self.make_report,
            self.clock,
            self.metrics,
            interval_s=options.report_interval_s,
            backoff_max_s=options.report_backoff_max_s,
        )
        self.supervisor.machine.subscribe(self._on_transition)
        self.started_at = self.clock.monotonic()
        self.gpus: list[dict[str, str]] = []
        self._gpu_query = gpu_query
        self._version_warned: str | None = None

    async def find_device(self) -> None:
        """Once, before the first launch: list the node's GPUs and launch the engine on the device they make
        (`agent.gpus.device_of`), saying which of the spec's flags that device drops and why."""
        self.gpus = await self._gpu_query()
        self.launch_config = dataclasses.replace(self.launch_config, device=device_of(self.gpus))
        self.launcher = make_launcher(self.pool, self.launch_config)
        dropped = self.launcher.dropped_flags()
        if dropped:
            log.warning(
                "no GPU on this node (nvidia-smi lists none): %s runs on the CPU without %s",
                self.pool.engine.kind,
                "; ".join(f"{flag} ({why})" for flag, why in dropped.items()),
            )

    async def _spawn(self) -> EngineProcess:
        on_line = self.starts.launched(self.clock.monotonic(), self.clock.time())
        return await self.launcher.start(on_line=on_line)

    async def _fetch(self) -> None:
        """Fetch the model, then each LoRA adapter, in a worker thread (boto3 and hashing block); the launcher then
        loads the local copies (a Hub fallback leaves that one to the engine)."""
        fetcher = self.fetcher
        assert fetcher is not None
        self.starts.fetch_began(self.clock.monotonic(), self.clock.time())
        self.fetched = await _fetch_in_thread(fetcher)
        adapter_dirs = {}
        for name, adapter_fetcher in self.adapter_fetchers.items():
            fetched = await _fetch_in_thread(adapter_fetcher)
            if fetched.model_dir is not None:
                adapter_dirs[name] = str(fetched.model_dir)
        model_dir = None if self.fetched.model_dir is None else str(self.fetched.model_dir)
        if model_dir is not None or adapter_dirs:
            config = dataclasses.replace(self.launch_config, model_dir=model_dir, adapter_dirs=adapter_dirs)
            self.launcher = make_launcher(self.pool, config)
        self.starts.fetch_done(self.clock.monotonic())

    def _on_transition(self, transition: Transition) -> None:
        if transition.event is Event.HEALTHY:
            self.starts.healthy(transition.at)
        if transition.event is Event.WARMED:  # the supervisor read the engine's /version just before
            self._check_version()
        self.reporter.kick()  # any state change is worth telling the control plane about now

    def _check_version(self) -> None:
        """The engine's release against the pool's pin: the gauge, and one WARNING per release that differs."""
        reported, pinned = self.supervisor.engine_version, self.pool.engine.version
        matches = version_matches(reported, pinned)
        self.metrics.engine_version_mismatch.set(1 if matches is False else 0)
        if matches is False and reported != self._version_warned:
            self._version_warned = reported
            log.warning(
                "engine reports version %s but pool %s pins engine.version %s: its flags are built for %s",
                reported, self.pool.name, pinned, pinned,
            )  # fmt: skip

    def make_report(self, load: Load) -> LoadReport:
        sup = self.supervisor
        return LoadReport(
            replica=self.options.replica,
            pool=self.pool.name,
            engine_url=self.engine_url,
            agent_url=self.agent_url,
            kv_events_url=self.kv_events_url,
            role=self.pool.role,
            side_channel=self.side_channel,
            state=sup.state.value,
            waiting=load.waiting,
            running=load.running,
            kv_usage=load.kv_usage,
            ttft_p99_s=load.ttft_p99_s,
            tokens_per_s=load.tokens_per_s,
            prefix_hit_rate=load.prefix_hit_rate,
            model=self.pool.served_name,
            engine_version=self.engine_version,
            uptime_s=sup.engine_uptime_s(),
            restarts=sup.restarts,
            start=self.starts.info(),
            ts=self.clock.time(),
        )

    @property
    def kv_events_url(self) -> str | None:
        """Where the engine publishes its KV-cache events (engine.kvEvents), as others reach it; else None."""
        port = self.launch_config.kv_events_port
        return (
            None if port is None else f"tcp://{reachable(self.options.engine_host, self.options.advertise_host)}:{port}"
        )

    @property
    def side_channel(self) -> str | None:
        """Where a prefill or decode engine's NIXL handshake is reached (``host:port``); None for an aggregated one."""
        channel = self.launch_config.side_channel
        return None if channel is None else str(channel)

    @property
    def engine_version(self) -> str:
        return self.supervisor.engine_version or f"{self.pool.engine.kind}-{self.pool.engine.version}"

    @property
    def replica(self) -> str:
        return self.options.replica

    def status(self) -> AgentStatus:
        sup = self.supervisor
        load = self.reporter.last_load
        now = self.clock.monotonic()
        return AgentStatus(
            replica=self.options.replica,
            pool=self.pool.name,
            model=self.pool.served_name,
            role=self.pool.role,
            side_channel=self.side_channel,
            engine=EngineInfo(
                kind=self.pool.engine.kind,
                version=self.engine_version,
                argv=list(self.launcher.argv()),
                log=str(self.options.log_path) if self.options.log_path else None,
                device=self.launch_config.device,
                dropped_flags=list(self.launcher.dropped_flags()),
                version_pinned=self.pool.engine.version,
                version_matches=version_matches(sup.engine_version, self.pool.engine.version),
            ),
            engine_url=self.engine_url,
            engine_pid=sup.engine.pid if sup.engine is not None else None,
            agent_url=self.agent_url,
            state=sup.state.value,
            ready=sup.machine.ready,
            state_since_s=round(now - sup.machine.since, 3),
            uptime_s=round(now - self.started_at, 3),
            engine_uptime_s=round(sup.engine_uptime_s(), 3),
            restarts=sup.restarts,
            last_exit_code=sup.last_exit_code,
            crash_failures_in_window=sup.crashes.recent(now),
            load=LoadInfo(
                waiting=load.waiting,
                running=load.running,
                kv_usage=load.kv_usage,
                ttft_p99_s=load.ttft_p99_s,
                tokens_per_s=load.tokens_per_s,
            ),
            control_plane=ControlPlaneLink(
                url=self.control.base_url, consecutive_report_failures=self.reporter.consecutive_push_failures
            ),
            gpus=self.gpus,
            last_error=sup.last_error,
            model_store=self._store_status(),
            start=self.starts.info(),
            transitions=[
                TransitionInfo(
                    source=t.source.value, event=t.event.value, to=t.target.value, ago_s=round(now - t.at, 3)
                )
                for t in sup.machine.history[-20:]
            ],
        )

    def _store_status(self) -> ModelStoreInfo | None:
        fetcher = self.fetcher
        if fetcher is None:
            return None
        return ModelStoreInfo(
            manifest=fetcher.url(fetcher.keys.manifest),
            model_dir=str(fetcher.model_dir),
            phase=fetcher.phase,
            bytes_fetched=fetcher.bytes_fetched,
            source=self.fetched.source if self.fetched is not None else None,
        )

    async def serve(self) -> int:
        """Run the API, the reporter and the supervisor; return the exit code when the engine has stopped."""
        server = ApiServer(create_app(self), bind(self.options.host, self.options.port))
        await server.start()
        log.info("agent %s for pool %s on %s", self.options.replica, self.pool.name, self.agent_url)
        reporter = asyncio.ensure_future(self.reporter.run())
        await self.find_device()
        try:
            code = await self.supervisor.run()
            if self.control.base_url is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.reporter.push_once(), timeout=3.0)  # tell it we stopped
            return code
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            await server.stop()


def _fetchers(
    pool: PoolSpec, store: StoreOptions | None, s3: Any, metrics: AgentMetrics
) -> tuple[ModelFetcher | None, dict[str, ModelFetcher]]:
    """The model's fetcher and one per LoRA adapter (by name), none without a store; ``s3`` None: a client from
    boto3's own settings."""
    if store is None:
        return None, {}

    def fetcher(client: Any, source: str, revision: str) -> ModelFetcher:
        return ModelFetcher(
            client,
            store.bucket,
            ModelKeys(store.prefix, source, revision),
            store.cache_dir,
            metrics,
            hub_fallback=store.hub_fallback,
            concurrency=store.concurrency,
            part_size=store.part_size,
        )

    model = fetcher(
        s3 if s3 is not None else _s3_client(store.region, store.concurrency), pool.model, pool.model_revision
    )
    # LoRA adapters live in the same store, each under its own id and revision.
    return model, {a.name: fetcher(model.client, a.source, a.revision) for a in pool.adapters}


def _s3_client(region: str | None, concurrency: int) -> Any:
    import boto3  # only agents with a model store pay for the import
    from botocore.config import Config

    # One pooled connection per ranged GET in flight (botocore keeps 10), else each extra one reconnects.
    return boto3.client("s3", region_name=region, config=Config(max_pool_connections=max(10, concurrency)))


async def _fetch_in_thread(fetcher: ModelFetcher) -> FetchResult:
    try:
        return await asyncio.to_thread(fetcher.fetch)
    except asyncio.CancelledError:
        fetcher.cancel()  # a drain: the thread stops at its next chunk instead of finishing the download
        raise
