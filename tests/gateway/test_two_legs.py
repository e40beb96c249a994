"""The two legs of a disaggregated pool (`gateway.two_legs`) in the request pipeline, on a scripted wire.

The pipeline is `tests.gateway.test_service`'s: the real gateway but for the engines' answers, which come from a
script. The pool ``qwen-7b`` is disaggregated; its prefill role pool ``qwen-7b-prefill`` has replicas ``p0`` and
``p1``, the pool itself ``a``. Each test says what the engines answer and checks what each received.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.errors import UpstreamConnectError, UpstreamStatus, UpstreamTimeout
from gateway.proxy import JsonAnswer, Usage
from tests.gateway.test_service import POOL, Pipeline, answer, pipeline
from tests.support.stacks import MODEL

PREFILL = f"{POOL}-prefill"
PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "engine-p",
    "remote_request_id": "cmpl-x-0-abcd",
    "remote_host": "10.0.0.9",
    "remote_port": 5600,
    "tp_size": 1,
}


def prefilled(params: dict[str, Any] | None = PARAMS) -> JsonAnswer:
    """A prefill engine's answer to its leg: one token, and the KV cache's whereabouts."""
    body: dict[str, Any] = {"model": MODEL, "choices": [], "usage": {"prompt_tokens": 12}, "kv_transfer_params": params}
    return JsonAnswer(200, json.dumps(body).encode(), "application/json", Usage(12, 1))


def _pd(threshold: int = 0) -> dict[str, Any]:
    return {"pools.0.disaggregation": {"thresholdTokens": threshold, "prefill": {"replicas": {"min": 1, "max": 2}}}}


def _with_prefill(p: Pipeline, *replicas: str) -> None:
    p.gateway.endpoints.set_members(PREFILL, [(rid, f"http://{rid}.engine", True) for rid in replicas])


def _paths(p: Pipeline) -> dict[str, float]:
    name = "llmfleet_gateway_pd_requests_total"
    return {
        path: p.counter(name, {"path": path})
        for path in ("disaggregated", "aggregated", "prefill_failed", "decode_failed", "no_prefill_replica")
    }


async def test_a_prompt_over_the_threshold_is_prefilled_on_a_prefill_replica_then_decoded() -> None:
    async with pipeline([prefilled(), answer(12, 5)], replicas=("a",), **_pd()) as p:
        _with_prefill(p, "p0")
        response = await p.chat(max_tokens=16, stream_options={"include_usage": True}, min_tokens=2)
        assert isinstance(response, web.Response) and response.status == 200
        assert response.body == answer(12, 5).body  # the decode leg's answer, as is
        leg1, leg2 = p.upstream.sent
        assert (leg1.replica, leg2.replica) == ("p0", "a")
        assert leg1.body["stream"] is False and leg1.body["max_tokens"] == 1
        assert "stream_options" not in leg1.body and "min_tokens" not in leg1.body
        assert leg1.body["kv_transfer_params"]["do_remote_decode"] is True
        assert leg1.body["messages"] == leg2.body["messages"]
        # The decode leg is the client's request with the prefill engine's parameters, unchanged.
        assert leg2.body["kv_transfer_params"] == PARAMS
        assert leg2.body["max_tokens"] == 16 and leg2.body["min_tokens"] == 2
        assert leg1.headers["x-request-id"] == leg2.headers["x-request-id"]  # vLLM's pull contract: one id
        assert _paths(p)["disaggregated"] == 1
        (record,) = p.log.records
        assert (record["replica"], record["prompt_tokens"], record["completion_tokens"]) == ("a", 12, 5)


async def test_a_prompt_under_the_threshold_stays_on_the_decode_replica() -> None:
    async with pipeline([answer()], replicas=("a",), **_pd(threshold=100_000)) as p:
        _with_prefill(p, "p0")
        await p.chat()
        (sent,) = p.upstream.sent
        assert sent.replica == "a" and "kv_transfer_params" not in sent.body
        assert _paths(p)["aggregated"] == 1


async def test_a_failed_prefill_leg_is_tried_on_another_prefill_replica() -> None:
    async with pipeline([UpstreamConnectError("refused"), prefilled(), answer()], replicas=("a",), **_pd()) as p:
        _with_prefill(p, "p0", "p1")
        response = await p.chat()
        assert response.status == 200
        first, second, decode = p.upstream.sent
        assert {first.replica, second.replica} == {"p0", "p1"} and decode.replica == "a"
        assert decode.body["kv_transfer_params"] == PARAMS
        assert _paths(p)["disaggregated"] == 1


async def test_when_every_prefill_leg_fails_the_decode_replica_prefills_it_itself() -> None:
    failures = [UpstreamConnectError("refused"), UpstreamConnectError("refused")]
    async with pipeline([*failures, answer(12, 5)], replicas=("a",), **_pd()) as p:
        _with_prefill(p, "p0", "p1")
        response = await p.chat()
        assert isinstance(response, web.Response) and response.body == answer(12, 5).body
        decode = p.upstream.sent[-1]
        assert decode.replica == "a" and "kv_transfer_params" not in decode.body
        assert _paths(p)["prefill_failed"] == 1 and _paths(p)["disaggregated"] == 0


async def test_a_prefill_answer_without_transfer_parameters_is_not_passed_on() -> None:
    async with pipeline([prefilled(None), answer()], replicas=("a",), **_pd()) as p:
        _with_prefill(p, "p0")
        await p.chat()
        decode = p.upstream.sent[-1]
        assert decode.replica == "a" and "kv_transfer_params" not in decode.body
        assert _paths(p)["prefill_failed"] == 1


async def test_a_decode_leg_that_cannot_load_the_cache_is_answered_aggregated_on_the_same_replica() -> None:
    # vLLM under kvLoadFailurePolicy fail: a whole answer is a 500 when the KV cache cannot be read.
    refused = UpstreamStatus(500, b'{"error": {"message": "Internal server error", "code": 500}}', "application/json")
    async with pipeline([prefilled(), refused, answer(12, 5)], replicas=("a",), **_pd()) as p:
        _with_prefill(p, "p0")
        response = await p.chat()
        assert isinstance(response, web.Response) and response.status == 200 and response.body == answer(12, 5).body
        _, failed, again = p.upstream.sent
        assert failed.replica == again.replica == "a"
        assert "kv_transfer_params" in failed.body and "kv_transfer_params" not in again.body
        assert _paths(p)["decode_failed"] == 1


async def test_a_decode_leg_that_times_out_is_answered_aggregated_on_the_same_replica() -> None:
    # A transfer stuck on a starved machine: the decode leg's answer never came within the deadline.
    async with pipeline(
        [prefilled(), UpstreamTimeout("no answer within 600s"), answer(12, 5)], replicas=("a",), **_pd()
    ) as p:
        _with_prefill(p, "p0")
        response = await p.chat()
        assert isinstance(response, web.Response) and response.status == 200 and response.body == answer(12, 5).body
        _, stuck, again = p.upstream.sent
        assert stuck.replica == again.replica == "a" and "kv_transfer_params" not in again.body
        assert _paths(p)["decode_failed"] == 1


async def test_a_client_error_of_the_decode_leg_is_the_clients() -> None:
    refused = UpstreamStatus(400, b'{"error": {"message": "bad", "code": 400}}', "application/json")
    async with pipeline([prefilled(), refused], replicas=("a",), **_pd()) as p:
        _with_prefill(p, "p0")
        response = await p.chat()
        assert response.status == 400 and len(p.upstream.sent) == 2


async def test_without_a_ready_prefill_replica_the_request_is_aggregated() -> None:
    async with pipeline([answer()], replicas=("a",), **_pd()) as p:
        await p.chat()
        (sent,) = p.upstream.sent
        assert sent.replica == "a" and "kv_transfer_params" not in sent.body
        assert _paths(p)["no_prefill_replica"] == 1


async def test_an_aggregated_pool_never_runs_a_prefill_leg() -> None:
    async with pipeline([answer()], replicas=("a",)) as p:
        await p.chat()
        (sent,) = p.upstream.sent
        assert "kv_transfer_params" not in sent.body
        assert b"llmfleet_gateway_pd_requests_total{" not in p.gateway.metrics.render()
