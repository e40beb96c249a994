"""The control-auth verifiers: the shared secret, and TokenReview against a fake Kubernetes API server on loopback
(real HTTP); the client credential re-reading a rotated token file."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from fastapi import Depends, FastAPI

from fleet.protocol.control_auth import (
    REVIEW_PATH,
    Caller,
    ClientCredential,
    ControlAuth,
    Kind,
    SharedSecret,
    TokenReview,
    bearer_token,
    client_credential,
    same_host,
)

REVIEWER_TOKEN = "reviewer-own-token"


@dataclass
class FakeApiServer:
    """Answers TokenReviews from ``tokens`` (token -> (service account, pod)); records what it was sent."""

    url: str = ""
    tokens: dict[str, tuple[str, str]] = field(default_factory=dict)
    reviews: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    status: int = 201

    async def review(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.reviews.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        if self.status != 201:
            return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
        found = self.tokens.get(body["spec"]["token"])
        status: dict[str, Any] = {"authenticated": False}
        if found is not None:
            account, pod = found
            status = {
                "authenticated": True,
                "audiences": body["spec"]["audiences"],
                "user": {
                    "username": f"system:serviceaccount:llmfleet:{account}",
                    "extra": {"authentication.kubernetes.io/pod-name": [pod]},
                },
            }
        return web.json_response({**body, "status": status}, status=201)


@pytest.fixture
async def api_server() -> AsyncIterator[FakeApiServer]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_post(REVIEW_PATH, fake.review)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


class Now:
    """A `fleet.protocol.clock.Clock` that stands still until a test moves ``t``."""

    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
async def http(api_server: FakeApiServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {REVIEWER_TOKEN}"}
    async with httpx.AsyncClient(base_url=api_server.url, headers=headers, trust_env=False, timeout=5.0) as client:
        yield client


async def test_token_review_maps_the_service_account_to_a_kind_and_the_pod_from_extra(
    api_server: FakeApiServer, http: httpx.AsyncClient
) -> None:
    api_server.tokens["tok-a"] = ("llmfleet-engine", "engine-pod-0")
    api_server.tokens["tok-g"] = ("llmfleet-gateway", "gateway-pod-1")
    verifier = TokenReview(http, clock=Now())
    assert await verifier.verify("tok-a", "10.0.0.7") == Caller(Kind.AGENT, "engine-pod-0", "10.0.0.7")
    assert await verifier.verify("tok-g", "10.0.0.8") == Caller(Kind.GATEWAY, "gateway-pod-1", "10.0.0.8")
    assert api_server.reviews[0]["spec"] == {"token": "tok-a", "audiences": ["llmfleet"]}
    assert api_server.reviews[0]["kind"] == "TokenReview"
    assert api_server.authorizations[0] == f"Bearer {REVIEWER_TOKEN}"


async def test_token_review_refuses_unauthenticated_tokens_and_unknown_service_accounts(
    api_server: FakeApiServer, http: httpx.AsyncClient
) -> None:
    api_server.tokens["tok-other"] = ("default", "someone")
    verifier = TokenReview(http, clock=Now())
    assert await verifier.verify("tok-unknown", "10.0.0.7") is None
    assert await verifier.verify("tok-other", "10.0.0.7") is None


async def test_token_review_answers_are_cached_until_they_expire(
    api_server: FakeApiServer, http: httpx.AsyncClient
) -> None:
    api_server.tokens["tok-a"] = ("llmfleet-engine", "engine-pod-0")
    clock = Now()
    verifier = TokenReview(http, clock=clock)
    for _ in range(5):
        assert await verifier.verify("tok-a", "10.0.0.7") is not None
    assert len(api_server.reviews) == 1
    del api_server.tokens["tok-a"]  # revoked: seen once the cached answer expires
    clock.t += verifier.cache_s + 1
    assert await verifier.verify("tok-a", "10.0.0.7") is None
    assert len(api_server.reviews) == 2


async def test_token_review_raises_when_the_api_server_refuses_the_reviewer(
    api_server: FakeApiServer, http: httpx.AsyncClient
) -> None:
    api_server.status = 403
    with pytest.raises(httpx.HTTPStatusError):
        await TokenReview(http, clock=Now()).verify("tok-a", "10.0.0.7")


async def test_an_api_server_that_cannot_review_makes_a_503_with_retry_after_not_a_401(
    api_server: FakeApiServer, http: httpx.AsyncClient
) -> None:
    auth = ControlAuth(TokenReview(http, clock=Now()))
    app = FastAPI()
    auth.install(app)

    agent_only = Depends(auth.require(Kind.AGENT))

    @app.get("/guarded")
    async def guarded(caller: Caller | None = agent_only) -> dict[str, str]:
        return {"name": caller.name if caller else ""}

    api_server.tokens["tok-a"] = ("llmfleet-engine", "pod-a")
    headers = {"Authorization": "Bearer tok-a"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp") as client:
        assert (await client.get("/guarded", headers=headers)).json() == {"name": "pod-a"}
        api_server.status = 500
        headers = {"Authorization": "Bearer tok-b"}  # not cached: reviewed during the outage
        outage = await client.get("/guarded", headers=headers)
        api_server.status = 201
        unknown = await client.get("/guarded", headers=headers)
    assert (outage.status_code, outage.headers["Retry-After"]) == (503, "1")
    assert outage.json()["error"]["type"] == "service_unavailable"
    assert unknown.status_code == 401 and unknown.headers["WWW-Authenticate"] == "Bearer"


async def test_shared_secret_takes_the_claimed_kind_only_with_the_right_secret() -> None:
    verifier = SharedSecret("s3cret")
    assert await verifier.verify("agent:s3cret", "127.0.0.1") == Caller(Kind.AGENT, "agent", "127.0.0.1")
    assert await verifier.verify("control-plane:s3cret", None) == Caller(Kind.CONTROL_PLANE, "control-plane")
    assert await verifier.verify("agent:wrong", "127.0.0.1") is None
    assert await verifier.verify("s3cret", "127.0.0.1") is None
    assert await verifier.verify("root:s3cret", "127.0.0.1") is None


def test_bearer_token_reads_only_the_bearer_scheme() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_same_host_holds_the_engine_url_to_the_callers_address() -> None:
    assert same_host("http://127.0.0.1:8000", "127.0.0.1")
    assert same_host("http://localhost:8000", "127.0.0.1")
    assert same_host("http://10.0.0.7:8000", "10.0.0.7")
    assert not same_host("http://10.0.0.8:8000", "10.0.0.7")
    assert not same_host("http://10.0.0.8:8000", "127.0.0.1")
    assert not same_host("http://engine.example:8000", "10.0.0.7")
    assert same_host("http://10.0.0.8:8000", None)  # the verifier knows no address


def test_client_credential_rereads_a_rotated_token_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    credential = ClientCredential(Kind.AGENT, path=path, raw=True)
    assert credential.headers() == {"Authorization": "Bearer first-token"}
    path.write_text("second-token-longer\n")
    os.utime(path, (1, 2))  # a different modification time whatever the clock's resolution
    assert credential.headers() == {"Authorization": "Bearer second-token-longer"}


def test_client_credential_from_env_prefers_the_shared_secret(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("projected")
    secret = ClientCredential.from_env(Kind.GATEWAY, {"LLMFLEET_CONTROL_TOKEN": "s", "LLMFLEET_CONTROL_TOKEN_FILE": ""})
    assert secret is not None and secret.token() == "gateway:s"
    projected = ClientCredential.from_env(Kind.GATEWAY, {"LLMFLEET_CONTROL_TOKEN_FILE": str(path)})
    assert projected is not None and projected.token() == "projected"
    assert ClientCredential.from_env(Kind.GATEWAY, {}) is None


def test_a_token_file_that_is_not_there_stops_the_client_at_start(tmp_path: Path) -> None:
    env = {"LLMFLEET_CONTROL_TOKEN_FILE": str(tmp_path / "missing")}
    with pytest.raises(ValueError, match="missing, which is no file: mount the projected token"):
        client_credential(Kind.AGENT, "kubernetes", env)
    (tmp_path / "missing").write_text("projected")
    found = client_credential(Kind.AGENT, "kubernetes", env)
    assert found is not None and found.token() == "projected"
