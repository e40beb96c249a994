"""NIXL: vLLM's NixlConnector pull protocol on a simulated engine, both ends (research file sections 1.3-1.7).

**Prefill end.** A leg with ``kv_transfer_params.do_remote_decode`` runs as usual; when it finishes length-capped (the
proxy sends ``max_tokens: 1``) its blocks stay referenced (`engine_sim.scheduler.Scheduler.held`) and `offer` leases
them: the answer's ``kv_transfer_params`` are the keys vLLM 0.32 returned, in its order (`params_of`). The lease
lasts ``kv_lease_duration`` (30 s) wall seconds; a pull extends it to now + 2/3 of that (vLLM's heartbeat), and the
decode end's ``done`` frees the blocks at once. The side channel (`engine_sim.side_channel`) answers ``get_meta``
(the handshake: this engine's id), ``read`` (ok when this engine holds those blocks under that request id) and
``done``.

**Decode end** (`pull`). Per remote engine id, the first contact is a handshake to ``remote_host:remote_port``
within vLLM's hard-coded 5 s (`HANDSHAKE_TIMEOUT_S`, wall), failing if the engine there has another id; it then
costs `KvLink.handshake_s` of model time (llm-d's ~5 s on a GPU; the CPU build's 0.113 s measured here, run 6).
Then ``read``, the transfer in model time (`fleet.capacity.disagg.KvLink.wire_seconds` of
``kv_bytes_per_token x`` the pulled tokens, over the GPU's instance's EFA share or ``TCP_GBPS`` on the CPU build),
observed in ``vllm:nixl_xfer_time_seconds``, then ``done``. A gone prefill engine fails the handshake only after the
5 s (ZMQ retries the refused connection: `engine_sim.side_channel`); a pull from an engine already handshaken with
fails at once when refused. `KvLoadError` is any failure; the caller applies ``kv_load_failure_policy``.

Not simulated: push mode, heartbeats while a pull waits (the lease extension stands for them), D-pinned blocks
(``remote_blocks_expiry_time`` is always null), more than one KV-cache group, TP/DP-rank port offsets.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram

from engine_sim.engine import Engine
from engine_sim.errors import ConfigError
from engine_sim.kv_transfer import KVTransferSettings
from engine_sim.request import SimRequest
from engine_sim.side_channel import SideChannelError, SideChannelServer, call
from fleet.capacity.catalog import INSTANCES
from fleet.capacity.disagg import HANDSHAKE_S, KvLink, link_gbps
from fleet.capacity.perf import kv_bytes_per_token

__all__ = ["HANDSHAKE_TIMEOUT_S", "KvLoadError", "NixlConnector", "kv_link", "remote_request_id", "start_nixl"]

log = logging.getLogger("engine_sim")

HANDSHAKE_TIMEOUT_S = 5.0  # vLLM's zmq.RCVTIMEO on the handshake socket (base_worker.py:1161), wall seconds
CPU_HANDSHAKE_S = 0.113  # run 6 of the CPU probe: get metadata 0.032 s + add agent 0.081 s
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)  # vLLM's NixlPromMetrics
_REQUIRED = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


class KvLoadError(Exception):
    """A decode leg could not pull its KV cache (handshake, read or a remote that does not hold the blocks)."""


def kv_link(gpu_profile: str, tensor_parallel_size: int, cpu_build: bool) -> KvLink:
    """The replica's link: its GPUs' share of their instance's EFA (the first instance with that GPU), else TCP."""
    instance = next((i.name for i in INSTANCES.values() if i.gpu == gpu_profile), None)
    return KvLink(link_gbps(instance, tensor_parallel_size), CPU_HANDSHAKE_S if cpu_build else HANDSHAKE_S)


def remote_request_id(kind: str, base: str) -> str:
    """vLLM's internal id of a leg: ``cmpl-<id>-0-<8 hex>`` (prompt index 0) or ``chatcmpl-<id>-<8 hex>``."""
    return f"{base}-0-{secrets.token_hex(4)}" if kind == "completion" else f"{base}-{secrets.token_hex(4)}"


async def start_nixl(settings: KVTransferSettings, engine: Engine) -> NixlConnector:
    """The engine's connector with its side channel bound; ConfigError when the address cannot be bound."""
    if settings.role == "kv_both":
        log.warning(
            "kv_role='kv_both' is deprecated and will be removed; set kv_role='kv_producer' for prefill instances "
            "and kv_role='kv_consumer' for decode instances"
        )
    config = engine.config
    link = kv_link(config.gpu_profile, config.tensor_parallel_size, config.platform.step_costs is not None)
    nixl = NixlConnector(settings, engine, link)
    try:
        await nixl.start()
    except OSError as exc:
        host, port = settings.side_channel_host, settings.side_channel_port
        raise ConfigError(f"NIXL side channel {host}:{port} cannot be bound: {exc}") from None
    return nixl


@dataclass
class _Lease:
    engine_request_id: str  # the scheduler's id, whose held blocks these are
    block_ids: list[int]  # as announced (vLLM's ids: block 0 is its null block, so the simulator's id + 1)
    expires: float  # wall (the engine clock's monotonic)


class NixlConnector:
    """One engine's NixlConnector: its side channel, its leases (prefill end) and its pulls (decode end)."""

    def __init__(self, settings: KVTransferSettings, engine: Engine, link: KvLink) -> None:
        self.settings = settings
        self.engine = engine
        self.link = link
        self.server = SideChannelServer(settings.side_channel_host, settings.side_channel_port, self.answer)
        self._leases: dict[str, _Lease] = {}
        self._peers: dict[str, asyncio.Task[None]] = {}  # remote engine id -> its (first) handshake
        self._tasks: set[asyncio.Task[None]] = set()
        self._per_token = kv_bytes_per_token(engine.config.facts)
        xfer = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            ["model_name", "engine"],
            buckets=XFER_BUCKETS,
            registry=engine.metrics.registry,
        )
        self.xfer_time = xfer.labels(*engine.metrics.label_values)

    async def start(self) -> None:
        await self.server.start()
        log.info("NIXL side channel listening on %s:%d", self.settings.side_channel_host, self.server.port)

    async def close(self) -> None:
        for task in [*self._tasks, *self._peers.values()]:
            task.cancel()
        await self.server.close()

    # -- prefill end -----------------------------------------------------------------------------------------
    def offer(self, request: SimRequest, kind: str, base_id: str) -> dict[str, Any] | None:
        """Lease a finished prefill leg's held blocks; its answer's ``kv_transfer_params`` (None when nothing is
        held: the leg was not length-capped, as vLLM returns none then)."""
        blocks = self.engine.scheduler.held.get(request.request_id)
        if blocks is None:
            return None
        rid = remote_request_id(kind, base_id)
        ids = [b.block_id + 1 for b in blocks]
        lease_s = self.settings.lease_s
        self._leases[rid] = _Lease(request.request_id, ids, self.engine.clock.monotonic() + lease_s)
        self._spawn(self._expire(rid))
        s = self.settings
        return {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [ids],
            "remote_engine_id": s.engine_id, "remote_request_id": rid, "remote_host": s.side_channel_host,
            "remote_port": self.server.port, "tp_size": self.engine.config.tensor_parallel_size, "dcp_size": 1,
            "pp_size": 1, "remote_num_tokens": request.num_computed_tokens, "remote_blocks_expiry_time": None,
            "transfer_mode": "pull", "remote_prefill_cached_tokens": max(0, request.num_cached_tokens),
        }  # fmt: skip

    async def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """The side channel's handler: ``get_meta``, ``read`` and ``done``."""
        op, rid = message.get("op"), message.get("request_id")
        if op == "get_meta":
            return {"ok": True, "engine_id": self.settings.engine_id, "block_size": self.engine.config.block_tokens}
        lease = self._leases.get(rid) if isinstance(rid, str) else None
        if op == "read":
            if lease is None or message.get("block_ids") != lease.block_ids:
                return {"ok": False, "error": f"no blocks held for request {rid!r}"}
            extended = self.engine.clock.monotonic() + self.settings.lease_s * 2 / 3
            lease.expires = max(lease.expires, extended)
            return {"ok": True}
        if op == "done":
            self._release(rid if lease is not None else None)
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r}"}

    async def _expire(self, rid: str) -> None:
        clock = self.engine.clock
        while (lease := self._leases.get(rid)) is not None:
            left = lease.expires - clock.monotonic()
            if left <= 0:
                log.warning("NIXL: lease of request %s expired before a pull; freeing its blocks", rid)
                self._release(rid)
                return
            await clock.sleep(left)

    def _release(self, rid: str | None) -> None:
        lease = self._leases.pop(rid, None) if rid is not None else None
        if lease is not None:
            self.engine.release_held(lease.engine_request_id)

    # -- decode end ------------------------------------------------------------------------------------------
    @staticmethod
    def wants_pull(params: Mapping[str, Any]) -> bool:
        """vLLM pulls only with every remote field present; otherwise it warns and prefills locally."""
        if not params.get("do_remote_prefill"):
            return False
        if all(params.get(key) is not None for key in _REQUIRED):
            return True
        log.warning("Got invalid KVTransferParams: %s. This request will not utilize KVTransfer", dict(params))
        return False

    async def pull(self, params: Mapping[str, Any], prompt_ids: Sequence[int], cache_salt: str | None) -> int:
        """Pull a decode leg's prompt KV from its prefill engine; the prompt tokens it covers. KvLoadError."""
        host, port = str(params["remote_host"]), params["remote_port"]
        engine_id, rid = str(params["remote_engine_id"]), str(params["remote_request_id"])
        if not isinstance(port, int):
            raise KvLoadError(f"remote_port {port!r} is not a port")
        await self._handshake(engine_id, host, port)
        block_ids = [b for group in params.get("remote_block_ids") or [] for b in group]
        message = {"op": "read", "request_id": rid, "block_ids": block_ids}
        try:
            read = await call(host, port, message, HANDSHAKE_TIMEOUT_S, retry_refused=False)
        except SideChannelError as exc:
            raise KvLoadError(f"NIXL transfer failure: {exc}") from None
        if not read.get("ok"):
            raise KvLoadError(f"NIXL transfer failure: {read.get('error')}")
        remote = params.get("remote_num_tokens")
        tokens = min(len(prompt_ids), remote if isinstance(remote, int) else len(prompt_ids))
        local = self.engine.scheduler.kv.cached_prefix_tokens(prompt_ids, cache_salt)
        seconds = self.link.wire_seconds(max(0, tokens - local) * self._per_token)
        try:
            await self.engine.clock.sleep(seconds / self.engine.time_scale)
            self.xfer_time.observe(seconds)
        finally:  # pulled or abandoned (client gone): the prefill engine may free the blocks
            self._spawn(self._notify_done(host, port, rid))
        return tokens

    async def _handshake(self, engine_id: str, host: str, port: int) -> None:
        task = self._peers.get(engine_id)
        if task is None:
            task = self._peers[engine_id] = asyncio.get_running_loop().create_task(self._meet(engine_id, host, port))
        try:
            await asyncio.shield(task)
        except KvLoadError:
            if self._peers.get(engine_id) is task:
                del self._peers[engine_id]  # the next leg for that engine tries again
            raise

    async def _meet(self, engine_id: str, host: str, port: int) -> None:
        try:
            meta = await call(host, port, {"op": "get_meta"}, HANDSHAKE_TIMEOUT_S)
        except SideChannelError as exc:
            raise KvLoadError(f"NIXL transfer failure: handshake_failed ({exc})") from None
        if meta.get("engine_id") != engine_id:
            raise KvLoadError(
                f"Remote NIXL agent engine ID mismatch. Expected {engine_id}, received {meta.get('engine_id')}."
            )
        await self.engine.clock.sleep(self.link.handshake_s / self.engine.time_scale)

    async def _notify_done(self, host: str, port: int, rid: str) -> None:
        try:
            await call(host, port, {"op": "done", "request_id": rid}, HANDSHAKE_TIMEOUT_S, retry_refused=False)
        except SideChannelError as exc:  # the lease frees the blocks in the end
            log.warning("NIXL: could not notify %s:%d that %s was pulled: %s", host, port, rid, exc)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
