"""RedisQuota: the quota model of `gateway.quota.base` shared by every gateway replica through Redis.

Each check-and-take is one Lua script, so it is atomic across gateways: two replicas can never both take the
last token (the per-pod counting and concurrent-bypass failures of other gateways). Time comes from Redis
``TIME`` inside the script, so gateway clocks never need to agree. Keys (``{tenant}`` is a cluster hash tag):
``llmfleet:quota:{tenant}:rps`` and ``:tpm`` (hashes: level ``t``, timestamp ``ts``), ``:conc`` (sorted set of
request ids scored by lease expiry).

`RedisQuota.from_url` connects with short timeouts and one immediate retry on a connection error (a pooled
connection that a restart broke is replaced at once): a Redis that is gone (connection refused) fails a request at
once and one that does not answer within 2 s fails it then, never after redis-py's default back-off;
`gateway.quota.failover` decides what happens next.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError, RedisError

from gateway.errors import QuotaExceeded, QuotaStoreUnavailable
from gateway.quota.base import QuotaBackend, QuotaLimits, Reservation

log = logging.getLogger("llmfleet.gateway.quota")

__all__ = ["RedisQuota"]

_LEVEL = """
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function level(key, cap, rate, now)
  local v = redis.call('HMGET', key, 't', 'ts')
  local t, ts = tonumber(v[1]), tonumber(v[2])
  if t == nil or ts == nil then return cap end
  local lv = t + math.max(0, now - ts) * rate
  if lv > cap then lv = cap end
  return lv
end
"""

# KEYS: rps, tpm, conc. ARGV: rps, rps_burst, tpm, cost, max_conc, request_id, lease_s
_ACQUIRE = (
    _LEVEL
    + """
local now = now_s()
local rps, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tpm, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_conc, lease = tonumber(ARGV[5]), tonumber(ARGV[7])
local tps = tpm / 60.0
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local open = redis.call('ZCARD', KEYS[3])
if open >= max_conc then return {0, 'concurrency', tostring(open), '1'} end
local r = level(KEYS[1], burst, rps, now)
if r < 1 then return {0, 'rps', tostring(r), tostring((1 - r) / rps)} end
local k = level(KEYS[2], tpm, tps, now)
if k < cost then return {0, 'tpm', tostring(k), tostring((cost - k) / tps)} end
redis.call('HSET', KEYS[1], 't', tostring(r - 1), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rps) + 5)
redis.call('HSET', KEYS[2], 't', tostring(k - cost), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[2], 65)
redis.call('ZADD', KEYS[3], now + lease, ARGV[6])
redis.call('EXPIRE', KEYS[3], math.ceil(lease) + 5)
return {1, 'ok', '0', '0'}
"""
)

# KEYS: tpm, conc. ARGV: tpm, refund, request_id
_RELEASE = (
    _LEVEL
    + """
local now = now_s()
redis.call('ZREM', KEYS[2], ARGV[3])
local tpm, refund = tonumber(ARGV[1]), tonumber(ARGV[2])
if refund ~= 0 then
  local k = level(KEYS[1], tpm, tpm / 60.0, now) + refund
  if k > tpm then k = tpm end
  redis.call('HSET', KEYS[1], 't', tostring(k), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[1], 65)
end
return 1
"""
)


# A healthy Redis answers in milliseconds; the slack is for the gateway's own event loop, which on a busy host can
# run a connect's or a reply's callback late: a false outage would put quotas on the local share for a second.
CONNECT_TIMEOUT_S = 2.0
COMMAND_TIMEOUT_S = 2.0


class RedisQuota(QuotaBackend):
    """Raises QuotaStoreUnavailable from `acquire` when Redis does not answer; `release` never raises."""

    def __init__(self, client: Redis, lease_s: float = 900.0, prefix: str = "llmfleet:quota") -> None:
        self._redis = client
        self._lease_s = lease_s
        self._prefix = prefix
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str, lease_s: float = 900.0) -> RedisQuota:
        """A backend on a new client for ``url`` with the module's timeouts and one immediate retry."""
        client = Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=COMMAND_TIMEOUT_S,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),  # not timeouts: no doubling
        )
        return cls(client, lease_s=lease_s)

    def _key(self, tenant: str, part: str) -> str:
        return f"{self._prefix}:{{{tenant}}}:{part}"

    async def acquire(self, tenant: str, limits: QuotaLimits, request_id: str, tokens: int) -> Reservation:
        keys = [self._key(tenant, "rps"), self._key(tenant, "tpm"), self._key(tenant, "conc")]
        args: list[Any] = [
            limits.requests_per_second,
            limits.request_burst,
            limits.tokens_per_minute,
            tokens,
            limits.max_concurrency,
            request_id,
            self._lease_s,
        ]
        try:
            ok, reason, level, retry = await self._acquire(keys=keys, args=args)
        except RedisError as exc:
            raise QuotaStoreUnavailable(f"the quota store is unavailable ({type(exc).__name__})") from exc
        if int(ok) != 1:
            reason = reason.decode() if isinstance(reason, bytes) else str(reason)
            raise QuotaExceeded(_message(tenant, limits, reason, tokens), retry_after=float(retry))
        return Reservation(tenant, request_id, tokens, limits)

    async def release(self, reservation: Reservation, used_tokens: int) -> None:
        try:
            await self.settle(reservation, used_tokens)
        except QuotaStoreUnavailable as exc:
            # The answer is already sent; the slot's lease expires on its own (lease_s), so nothing is lost for good.
            log.warning("quota release for %s failed: %s", reservation.tenant, exc)

    async def settle(self, reservation: Reservation, used_tokens: int) -> None:
        """`release`, raising QuotaStoreUnavailable when Redis does not answer (the caller may settle it later)."""
        keys = [self._key(reservation.tenant, "tpm"), self._key(reservation.tenant, "conc")]
        refund = reservation.tokens - max(0, used_tokens)
        try:
            await self._release(keys=keys, args=[reservation.limits.tokens_per_minute, refund, reservation.request_id])
        except RedisError as exc:
            raise QuotaStoreUnavailable(f"the quota store is unavailable ({type(exc).__name__})") from exc

    async def ping(self, timeout_s: float) -> bool:
        """Whether Redis answers a PING within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._redis.ping()
        except (RedisError, OSError, TimeoutError):
            return False
        return True

    async def close(self) -> None:
        await self._redis.aclose()


def _message(tenant: str, limits: QuotaLimits, reason: str, tokens: int) -> str:
    if reason == "concurrency":
        return f"tenant {tenant!r} is at its maxConcurrency of {limits.max_concurrency}"
    if reason == "rps":
        return f"tenant {tenant!r} is over {limits.requests_per_second:g} requests/s"
    return f"tenant {tenant!r} is over {limits.tokens_per_minute} tokens/min (request reserves {tokens})"
