"""Auth (hashed keys, secrets) and request-body parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.auth import KeyRing, keys_from_secret, secret_env_name
from gateway.body import DEFAULT_RESERVE_TOKENS, parse_body
from gateway.errors import BadRequest, Unauthorized
from tests.support.stacks import KEYS, spec


def test_keys_map_to_their_tenant_and_unknown_keys_fail() -> None:
    ring = KeyRing(spec("gateway").tenants, {"bronze": ["sk-from-secret"]})
    assert ring.authenticate(f"Bearer {KEYS['gold']}").name == "gold"
    assert ring.authenticate("bearer sk-from-secret").name == "bronze"
    for header in (None, "", "Bearer", "Basic abc", f"Bearer {KEYS['gold']}x"):
        with pytest.raises(Unauthorized):
            ring.authenticate(header)


def test_secret_keys_from_env_or_file(tmp_path: Path) -> None:
    assert secret_env_name("tenantKeys:acme") == "LLMFLEET_SECRET_TENANTKEYS_ACME"
    env = {"LLMFLEET_SECRET_TENANTKEYS_ACME": json.dumps(["k1", "k2"])}
    assert keys_from_secret("tenantKeys:acme", env, None) == ["k1", "k2"]
    (tmp_path / "tenantKeys_acme").write_text("# keys\nk3\n\nk4\n")
    assert keys_from_secret("tenantKeys:acme", {}, tmp_path) == ["k3", "k4"]
    assert keys_from_secret("tenantKeys:none", {}, tmp_path) == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[]", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (b"[" * 5000 + b"]" * 5000, None),  # nested past the parser's recursion limit
        (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', None),  # half a surrogate pair
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', None),  # not UTF-8
    ],
)
def test_bad_chat_bodies_are_400_naming_the_field(body: bytes, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body(body, "chat")
    assert info.value.param == param


def test_stream_asks_the_engine_for_usage_without_touching_other_fields() -> None:
    raw = json.dumps({"model": "m", "prompt": "x" * 40, "stream": True, "max_tokens": 7, "n": 2}).encode()
    parsed = parse_body(raw, "completion")
    assert (parsed.prompt_tokens, parsed.reserve_tokens, parsed.client_wants_usage) == (10, 24, False)
    sent = json.loads(parsed.upstream_body())
    assert sent["stream_options"] == {"include_usage": True} and sent["max_tokens"] == 7
    plain = parse_body(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', "chat")
    assert plain.max_tokens == DEFAULT_RESERVE_TOKENS


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("payload", "rewritten"),
    [
        pytest.param(CHAT, False, id="not-streamed"),
        pytest.param(
            {**CHAT, "stream": True, "stream_options": {"include_usage": True}}, False, id="client-asks-usage"
        ),
        pytest.param({**CHAT, "stream": True}, True, id="stream-without-options"),
        pytest.param({**CHAT, "stream": True, "stream_options": {"include_usage": False}}, True, id="usage-declined"),
    ],
)
def test_body_is_sent_as_received_unless_usage_must_be_asked(payload: dict[str, object], rewritten: bool) -> None:
    raw = json.dumps(payload).encode()
    sent = parse_body(raw, "chat").upstream_body()
    if rewritten:
        assert json.loads(sent) == {**payload, "stream_options": {"include_usage": True}}
    else:
        assert sent is raw  # the received bytes, not a re-serialisation


def test_hashes_file_adds_digests_for_known_tenants(tmp_path: Path) -> None:
    from fleet.protocol.keys import hash_api_key
    from gateway.auth import KEY_HASHES_FILE, hashes_from_file

    path = tmp_path / KEY_HASHES_FILE
    path.write_text(json.dumps({"gold": [hash_api_key("sk-mounted")], "elsewhere": [hash_api_key("x")]}))
    ring = KeyRing(spec("gateway").tenants, extra_hashes=hashes_from_file(path))
    assert ring.authenticate("Bearer sk-mounted").name == "gold"
    assert hashes_from_file(tmp_path / "absent.json") == {}


def test_valid_bodies_the_api_allows_are_accepted() -> None:
    chat = parse_body(
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "stream": null}', "chat"
    )
    assert chat.stream is False and "\U0001f600" in chat.prompt  # an escaped surrogate *pair* is one character
    batch = parse_body(b'{"model": "m", "prompt": [[1, 2, 3], [4, 5]]}', "completion")
    assert batch.prompt_tokens == 5


def test_a_model_alias_is_sent_to_the_engine_under_its_served_name() -> None:
    parsed = parse_body(b'{"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "hi"}', "completion")
    assert json.loads(parsed.upstream_body("qwen2.5-7b-instruct"))["model"] == "qwen2.5-7b-instruct"
    assert parsed.upstream_body("Qwen/Qwen2.5-7B-Instruct") == parsed.raw  # the served name itself: untouched
