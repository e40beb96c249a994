"""Engine-only fields and headers: vLLM's extensions that steer scheduling, caching or transfer are the gateway's
to set; a client sending one gets a 400 in its API's shape naming it, and engine headers never pass."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.body import ENGINE_ONLY, parse_body
from gateway.call import upstream_headers
from gateway.errors import BadRequest
from tests.gateway.conftest import serve, settings_for
from tests.support.stacks import KEYS, MODEL

BODIES: dict[str, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "x"}]},
    "completion": {"prompt": "x"},
    "response": {"input": "x"},
    "message": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
    "embedding": {"input": "x"},
    "count": {"messages": [{"role": "user", "content": "x"}]},
}
VALUES: dict[str, Any] = {
    "priority": -100,  # vLLM: lower runs earlier
    "request_id": "another-tenants-id",
    "session_id": "s-1",
    "kv_transfer_params": {"do_remote_prefill": True, "remote_block_ids": [1, 2]},
    "ec_transfer_params": {"do_remote_encode": True},
    "vllm_xargs": {"anything": 1},
}


def test_the_list_is_the_documented_one() -> None:
    assert set(ENGINE_ONLY) == set(VALUES)


@pytest.mark.parametrize("kind", sorted(BODIES))
@pytest.mark.parametrize("field", ENGINE_ONLY)
def test_an_engine_only_field_is_a_400_naming_it_on_every_route(field: str, kind: str) -> None:
    raw = json.dumps({"model": "m", **BODIES[kind], field: VALUES[field]}).encode()
    with pytest.raises(BadRequest) as info:
        parse_body(raw, kind)  # type: ignore[arg-type]
    assert info.value.param == field and field in info.value.message


@pytest.mark.parametrize("field", ENGINE_ONLY)
def test_a_null_engine_only_field_is_dropped_not_forwarded(field: str) -> None:
    parsed = parse_body(json.dumps({"model": "m", **BODIES["chat"], field: None}).encode(), "chat")
    assert field not in json.loads(parsed.upstream_body("m", None, "salt"))


GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}


@pytest.mark.parametrize("field", ENGINE_ONLY)
async def test_the_refusal_is_openai_shaped_on_chat_and_anthropic_shaped_on_messages(
    shared_sim: Any, field: str
) -> None:
    chat = {"model": MODEL, **BODIES["chat"], field: VALUES[field]}
    message = {"model": MODEL, **BODIES["message"], field: VALUES[field]}
    async with serve(settings_for([shared_sim.url])) as (url, _), aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=chat, headers=GOLD) as resp:
            openai = (resp.status, await resp.json())
        async with session.post(url + "/v1/messages", json=message, headers=GOLD) as resp:
            anthropic = (resp.status, await resp.json())
    assert openai[0] == 400 and openai[1]["error"]["param"] == field
    assert openai[1]["error"]["type"] == "invalid_request_error"
    assert anthropic[0] == 400 and anthropic[1]["type"] == "error"
    assert anthropic[1]["error"]["type"] == "invalid_request_error" and field in anthropic[1]["error"]["message"]


@pytest.mark.parametrize(
    "header",
    ["X-Vllm-Priority", "X-Session-ID", "X-data-parallel-rank", "X-Vllm-Anything", "X-Tenant", "Authorization"],
)
def test_engine_headers_a_client_sends_never_reach_the_engine(header: str) -> None:
    request = make_mocked_request(
        "POST", "/v1/chat/completions", headers=CIMultiDict({header: "0", "traceparent": "00-a-b-01"})
    )
    sent = upstream_headers(request, "rid", "sk-engines")
    assert {name.lower() for name in sent} == {"content-type", "x-request-id", "authorization", "traceparent"}
    assert sent["Authorization"] == "Bearer sk-engines"  # the gateway's key, never the client's


def test_a_clients_request_id_prefixes_the_engines_and_never_is_it() -> None:
    """vLLM bases its request id on X-Request-Id: two requests that send the same id (two tenants, say) still get
    distinct ids on the engine, each beginning with the id the client sent (for tracing)."""
    request = make_mocked_request("POST", "/v1/chat/completions", headers=CIMultiDict({"X-Request-Id": "mine"}))
    first, second = (upstream_headers(request, "mine", None)["x-request-id"] for _ in range(2))
    assert first != second and first.startswith("mine-") and second.startswith("mine-")
