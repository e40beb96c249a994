"""The request pipeline (`gateway.service.Gateway.complete`) in-process, on an upstream whose wire is scripted.

Everything but the wire is the real gateway, as `gateway.app.build_gateway` builds it: the key ring, the models,
the quota, admission, the routers, the leases, health accounting and the retry budget. `ScriptedUpstream` only
answers each engine call with the next item of its script, and records what the engine would have received.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from fleet.protocol.promtext import counter_value, parse
from gateway.app import build_gateway
from gateway.call import REQUEST_ID
from gateway.endpoints import Endpoint
from gateway.errors import (
    GatewayError,
    ModelNotAllowed,
    ModelNotFound,
    QuotaExceeded,
    ServiceUnavailable,
    Unauthorized,
    UpstreamConnectError,
    UpstreamDiedEarly,
    UpstreamDraining,
    UpstreamError,
    UpstreamStatus,
    UpstreamUnavailable,
)
from gateway.metrics import AccessLog
from gateway.proxy import JsonAnswer, SseRelay, Usage
from gateway.quota.memory import MemoryQuota
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.tracing import Tracing
from gateway.upstream import Upstream
from tests.gateway.builders import ManualClock
from tests.support.stacks import KEYS, MODEL, spec

POOL = "qwen-7b"
# The replica with the fewest requests in flight, always: which replica a request goes to is known in advance.
LEAST_IN_FLIGHT = {"gateway.routing.scorers": [{"name": "in-flight"}], "gateway.routing.picker": {"name": "max-score"}}


def answer(prompt_tokens: int = 12, completion_tokens: int = 5) -> JsonAnswer:
    body = json.dumps({"model": MODEL, "choices": [], "usage": {"prompt_tokens": prompt_tokens}}).encode()
    return JsonAnswer(200, body, "application/json", Usage(prompt_tokens, completion_tokens))


@dataclasses.dataclass
class Sent:
    replica: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


class ScriptedUpstream(Upstream):
    """The real `Upstream` with its wire replaced: each engine call takes the next item of ``script`` (an answer
    to return, or an `UpstreamError` to raise), whichever replica the router picked."""

    def __init__(self, base: Upstream, script: list[JsonAnswer | UpstreamError]) -> None:
        super().__init__(
            base.endpoints,
            base.routers,
            base.session,
            base.timeouts,
            base.budget,
            base.max_attempts,
            base.metrics,
            base.clock,
        )
        self.script = script
        self.sent: list[Sent] = []

    async def send(self, ep: Endpoint, path: str, body: bytes, headers: dict[str, str]) -> JsonAnswer:
        self.sent.append(Sent(ep.id, path, json.loads(body), headers))
        result = self.script.pop(0)
        if isinstance(result, UpstreamError):
            raise result
        return result

    async def open(
        self, ep: Endpoint, path: str, body: bytes, headers: dict[str, str], hide_usage: bool
    ) -> tuple[SseRelay, bytes]:
        raise AssertionError("these tests send no streamed request")


class RecordedLog(AccessLog):
    """The access log's records, kept: what the gateway recorded of each request's Outcome."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))


@dataclasses.dataclass
class Pipeline:
    gateway: Gateway
    upstream: ScriptedUpstream
    log: RecordedLog

    async def chat(self, key: str | None = KEYS["gold"], **fields: Any) -> web.StreamResponse:
        payload = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, **fields}
        body = json.dumps(payload).encode()
        reader = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
        reader.feed_data(body)
        reader.feed_eof()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        request = make_mocked_request("POST", "/v1/chat/completions", headers=headers, payload=reader)
        request[REQUEST_ID] = f"req-{len(self.log.records)}"
        return await self.gateway.complete(request, "chat")

    async def refused(self, **kw: Any) -> GatewayError:
        with pytest.raises(GatewayError) as caught:
            await self.chat(**kw)
        return caught.value

    def counter(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        return counter_value(parse(self.gateway.metrics.render().decode()), name, labels)


@contextlib.asynccontextmanager
async def pipeline(
    script: list[JsonAnswer | UpstreamError], replicas: tuple[str, ...] = ("a", "b"), **overrides: Any
) -> AsyncIterator[Pipeline]:
    settings = GatewaySettings(spec=spec("gateway", **overrides), access_log=False, routing_seed=3)
    clock = ManualClock(1000.0)
    async with aiohttp.ClientSession() as session:
        built = build_gateway(settings, session, MemoryQuota(clock), clock, Tracing())
        upstream, log = ScriptedUpstream(built.upstream, script), RecordedLog()
        gateway = dataclasses.replace(built, upstream=upstream, access_log=log)
        gateway.endpoints.set_members(POOL, [(rid, f"http://{rid}.engine", True) for rid in replicas])
        yield Pipeline(gateway, upstream, log)


async def test_an_answer_comes_back_from_the_engine_that_received_the_served_name_and_the_gateways_headers() -> None:
    async with pipeline([answer(12, 5)]) as p:
        response = await p.chat(model=MODEL, user="u1")
        assert isinstance(response, web.Response) and response.status == 200
        (sent,) = p.upstream.sent
        assert response.body == answer(12, 5).body
        assert response.headers["x-llmfleet-replica"] == sent.replica
        assert sent.path == "/v1/chat/completions"
        assert sent.body["model"] == MODEL and sent.body["user"] == "u1"
        # The request's id prefixes the engine's, with a suffix the gateway draws (a client cannot name its id).
        assert re.fullmatch(r"req-0-[0-9a-f]{8}", sent.headers["x-request-id"])
        assert "Authorization" not in sent.headers  # the client's key never reaches an engine
        (record,) = p.log.records
        assert (record["status"], record["tenant"], record["pool"], record["attempts"]) == (200, "gold", POOL, 1)
        assert (record["prompt_tokens"], record["completion_tokens"]) == (12, 5)


@pytest.mark.parametrize(
    ("key", "error"),
    [
        pytest.param(None, Unauthorized, id="no key"),
        pytest.param("sk-not-a-key", Unauthorized, id="unknown key"),
        pytest.param(KEYS["other"], Unauthorized, id="no tenant's key"),
    ],
)
async def test_a_bad_key_is_refused_before_anything_else(key: str | None, error: type[GatewayError]) -> None:
    async with pipeline([answer()]) as p:
        refusal = await p.refused(key=key)
        assert isinstance(refusal, error) and refusal.status == 401
        assert json.loads(refusal.body())["error"]["type"] == "authentication_error"
        assert p.upstream.sent == []
        assert (p.log.records[0]["status"], p.log.records[0]["tenant"]) == (401, "-")


async def test_an_unknown_model_gets_openais_404_error_body() -> None:
    async with pipeline([answer()]) as p:
        refusal = await p.refused(model="no-such-model")
        assert isinstance(refusal, ModelNotFound)
        assert json.loads(refusal.body()) == {
            "error": {
                "message": "the model 'no-such-model' does not exist",
                "type": "not_found_error",
                "param": "model",
                "code": 404,
            }
        }
        assert p.upstream.sent == []
        assert (p.log.records[0]["status"], p.log.records[0]["model"]) == (404, "-")  # labels stay bounded


async def test_a_tenant_is_refused_a_model_its_allowed_models_leave_out() -> None:
    async with pipeline([answer()]) as p:
        refusal = await p.refused(key=KEYS["bronze"], model="small-model")
        assert isinstance(refusal, ModelNotAllowed) and refusal.status == 403
        assert p.upstream.sent == []


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(UpstreamConnectError("refused"), id="connect error"),
        pytest.param(UpstreamUnavailable("engine answered 503"), id="engine 503"),
        pytest.param(UpstreamDraining("engine answered 500 (draining)"), id="vLLM draining 500"),
        pytest.param(UpstreamDiedEarly("connection reset"), id="died before answering"),  # stays in rotation
    ],
)
async def test_a_failed_first_attempt_is_retried_on_another_replica_and_the_outcome_records_both(
    failure: UpstreamError,
) -> None:
    async with pipeline([failure, answer()], **LEAST_IN_FLIGHT) as p:
        busy = p.gateway.endpoints.get(POOL, "b")
        assert busy is not None
        busy.in_flight = 4  # other requests hold it: "a" is the first choice, and would be the second unless excluded
        response = await p.chat()
        assert response.status == 200
        first, second = p.upstream.sent
        assert (first.replica, second.replica) == ("a", "b")
        assert response.headers["x-llmfleet-replica"] == second.replica
        (record,) = p.log.records
        assert (record["attempts"], record["replica"], record["status"]) == (2, second.replica, 200)
        retried = {"model": MODEL, "reason": type(failure).__name__}
        assert p.counter("llmfleet_gateway_retries_total", retried) == 1
        # A replica that refused is out of rotation until its next good probe; one that broke stays in it.
        assert p.gateway.endpoints.routable(POOL) == (2 if isinstance(failure, UpstreamDiedEarly) else 1)


async def test_when_every_replica_fails_the_client_gets_503_and_the_outcome_counts_each_attempt() -> None:
    failures: list[JsonAnswer | UpstreamError] = [UpstreamConnectError("refused"), UpstreamConnectError("refused")]
    async with pipeline(failures) as p:
        refusal = await p.refused()
        assert isinstance(refusal, ServiceUnavailable) and refusal.status == 503
        assert {sent.replica for sent in p.upstream.sent} == {"a", "b"}
        assert (p.log.records[0]["attempts"], p.log.records[0]["status"]) == (2, 503)


async def test_an_engines_own_error_answer_is_relayed_as_it_came_and_not_retried() -> None:
    body = b'{"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}}'
    async with pipeline([UpstreamStatus(400, body, "application/json"), answer()]) as p:
        response = await p.chat()
        assert isinstance(response, web.Response)
        assert (response.status, response.body) == (400, body)
        assert len(p.upstream.sent) == 1
        assert (p.log.records[0]["attempts"], p.log.records[0]["status"]) == (1, 400)


async def test_a_quota_refusal_never_reaches_the_upstream() -> None:
    async with pipeline([answer(), answer()], **{"tenants.0.requestsPerSecond": 1}) as p:
        assert (await p.chat()).status == 200
        refusal = await p.refused()  # the same instant on the gateway's clock: the second request of the second
        assert isinstance(refusal, QuotaExceeded) and refusal.status == 429
        assert len(p.upstream.sent) == 1
        assert [r["status"] for r in p.log.records] == [200, 429]


async def test_a_pool_with_no_ready_replica_refuses_at_once_without_a_control_plane() -> None:
    async with pipeline([answer()], replicas=()) as p:
        refusal = await p.refused()
        assert isinstance(refusal, ServiceUnavailable) and refusal.headers() == {"Retry-After": "2"}
        assert p.upstream.sent == []
