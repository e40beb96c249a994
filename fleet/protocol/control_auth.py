"""Control auth: who may call the control plane (its writes, and its reads, which name engines) and the agents' writes.

A credential travels as ``Authorization: Bearer <token>``. A `Verifier` turns a token (and the TCP peer's address)
into a `Caller`, or None when the token is not valid. Two verifiers:

* `SharedSecret`: one per-fleet secret (``$LLMFLEET_CONTROL_TOKEN``; ``llmfleet up`` generates 32 random bytes).
  A caller presents ``<kind>:<secret>`` (``agent:...``); the secret is compared in constant time and the kind is
  the caller's claim: every holder of the secret is a fleet member, so the kind keeps honest callers apart but is
  no barrier between members. Per-kind separation comes with `TokenReview`.
* `TokenReview`: Kubernetes projected service-account tokens (audience ``llmfleet``), checked by the API server
  (``POST /apis/authentication.k8s.io/v1/tokenreviews``). The service account names the kind (`SERVICE_ACCOUNTS`:
  the fleet's object names from `fleet.protocol.contract`), the review's ``extra`` names the pod. Answers are cached for
  ``cache_s`` per token so a thousand agents reporting every second cost no thousand reviews a second.

Either way the caller's address is the TCP peer's (a pod's own IP inside a cluster; loopback locally): the
control plane holds a report's ``engine_url`` to it (`same_host`).

Server side, `ControlAuth.require(*kinds)` is a FastAPI dependency: no or an invalid credential -> 401, a valid
one of another kind -> 403, a verifier that cannot reach the API server -> 503 with Retry-After (an outage is not
the caller's fault: agents and gateways retry), all as OpenAI's error JSON (`install` registers the handler).
``ControlAuth(None)`` lets everyone through (auth off). No process runs that way unless told to: `resolve_mode` gives
the ``--auth`` mode from the flag or the environment and refuses (`NO_CREDENTIAL`) when there is neither a credential
nor ``--auth none``; `client_credential` does the same for a client's credential. Client side, `ClientCredential`
gives the header, re-reading a token file when it changes (projected tokens rotate); `BearerAuth` plugs it into an
httpx client.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from fleet.protocol import contract
from fleet.protocol.clock import Clock, SystemClock
from fleet.protocol.openai_error import error_dict

__all__ = [
    "AUDIENCE",
    "AUTH_MODES",
    "CONTROL_TOKEN_ENV",
    "CONTROL_TOKEN_FILE_ENV",
    "ENGINE_API_KEY_ENV",
    "NO_CREDENTIAL",
    "SERVICE_ACCOUNTS",
    "BearerAuth",
    "Caller",
    "ClientCredential",
    "ControlAuth",
    "ControlAuthError",
    "Kind",
    "OriginAuth",
    "SharedSecret",
    "TokenReview",
    "Verifier",
    "bearer_token",
    "client_credential",
    "default_mode",
    "make_verifier",
    "operator_auth",
    "origin",
    "resolve_mode",
    "same_host",
]

CONTROL_TOKEN_ENV = "LLMFLEET_CONTROL_TOKEN"  # the shared secret (never on a command line)
CONTROL_TOKEN_FILE_ENV = "LLMFLEET_CONTROL_TOKEN_FILE"  # a projected service-account token's path
ENGINE_API_KEY_ENV = "LLMFLEET_ENGINE_API_KEY"  # the engines' API key: agents and gateways only
AUDIENCE = "llmfleet"
REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


class Kind(enum.StrEnum):
    AGENT = "agent"
    GATEWAY = "gateway"
    CONTROL_PLANE = "control-plane"


SERVICE_ACCOUNTS: Mapping[str, Kind] = {
    contract.ENGINE_SERVICE_ACCOUNT: Kind.AGENT,
    contract.GATEWAY_NAME: Kind.GATEWAY,
    contract.CONTROL_PLANE_NAME: Kind.CONTROL_PLANE,
}


@dataclass(frozen=True)
class Caller:
    """A verified caller: its kind, a name (the pod, or ``<kind>`` for the shared secret) and its address."""

    kind: Kind
    name: str
    ip: str | None = None  # None: unknown (no address check possible)


class Verifier(Protocol):
    async def verify(self, token: str, peer: str | None) -> Caller | None:
        """The caller presenting ``token`` from ``peer``; None when the token is not valid."""


@dataclass(frozen=True)
class SharedSecret:
    """Tokens ``<kind>:<secret>``; the secret compared in constant time."""

    secret: str

    async def verify(self, token: str, peer: str | None) -> Caller | None:
        claimed, sep, secret = token.partition(":")
        valid = hmac.compare_digest(secret.encode(), self.secret.encode())
        if not (sep and valid and claimed in Kind.__members__.values()):
            return None
        return Caller(Kind(claimed), claimed, peer)


@dataclass
class TokenReview:
    """Projected service-account tokens reviewed by the Kubernetes API server (``http`` has its base URL, CA and
    the reviewer's own credential, see `TokenReview.in_cluster`)."""

    http: httpx.AsyncClient
    audience: str = AUDIENCE
    accounts: Mapping[str, Kind] = field(default_factory=lambda: dict(SERVICE_ACCOUNTS))
    cache_s: float = 60.0
    clock: Clock = field(default_factory=SystemClock)
    _cache: dict[str, tuple[float, Caller | None]] = field(default_factory=dict, repr=False)

    @classmethod
    def in_cluster(cls, account_dir: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount")) -> TokenReview:
        """Reviews through ``$KUBERNETES_SERVICE_HOST`` with the pod's own account token (needs RBAC ``create`` on
        ``tokenreviews``)."""
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        own = ClientCredential(Kind.CONTROL_PLANE, path=account_dir / "token", raw=True)
        http = httpx.AsyncClient(
            base_url=f"https://{host}:{port}", verify=str(account_dir / "ca.crt"), auth=BearerAuth(own), timeout=5.0
        )
        return cls(http)

    async def verify(self, token: str, peer: str | None) -> Caller | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock.monotonic()
        cached = self._cache.get(key)
        if cached is None or cached[0] <= now:
            if len(self._cache) > 10_000:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            cached = (now + self.cache_s, await self._review(token))
            self._cache[key] = cached
        caller = cached[1]
        return None if caller is None else Caller(caller.kind, caller.name, peer)

    async def _review(self, token: str) -> Caller | None:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        response = await self.http.post(REVIEW_PATH, json=body)
        response.raise_for_status()  # the API server refusing the reviewer is an outage, not a bad token
        status = response.json().get("status") or {}
        if not status.get("authenticated") or self.audience not in (status.get("audiences") or [self.audience]):
            return None
        user = status.get("user") or {}
        prefix, _, account = str(user.get("username", "")).rpartition(":")
        kind = self.accounts.get(account) if prefix.startswith("system:serviceaccount:") else None
        if kind is None:
            return None
        pods = (user.get("extra") or {}).get(POD_NAME_EXTRA) or [account]
        return Caller(kind, str(pods[0]))


class ControlAuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    del request  # Unused.
    assert isinstance(exc, ControlAuthError)
    kind = {401: "authentication_error", 403: "permission_error"}.get(exc.status, "service_unavailable")
    headers = {401: {"WWW-Authenticate": "Bearer"}, 503: {"Retry-After": "1"}}.get(exc.status)
    return JSONResponse(error_dict(exc.message, kind, exc.status), status_code=exc.status, headers=headers)


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when absent or another scheme."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class ControlAuth:
    """The server side: ``Depends(auth.require(Kind.AGENT))``; ``verifier`` None lets everyone through."""

    def __init__(self, verifier: Verifier | None) -> None:
        self.verifier = verifier

    def install(self, app: FastAPI) -> None:
        """Render refusals as OpenAI error JSON (401 authentication_error, 403 permission_error, and 503
        service_unavailable with Retry-After when the verifier could not reach the API server)."""
        app.add_exception_handler(ControlAuthError, _refused)

    def require(self, *kinds: Kind) -> Callable[[Request], Awaitable[Caller | None]]:
        async def caller(request: Request) -> Caller | None:
            if self.verifier is None:
                return None
            token = bearer_token(request.headers.get("authorization"))
            if token is None:
                raise ControlAuthError(401, "a control credential is required (Authorization: Bearer <token>)")
            peer = request.client.host if request.client else None
            try:
                found = await self.verifier.verify(token, peer)
            except httpx.HTTPError as exc:  # the API server is out, not the caller wrong: it may retry
                raise ControlAuthError(503, f"the credential could not be checked: {type(exc).__name__}") from exc
            if found is None:
                raise ControlAuthError(401, "invalid control credential")
            if found.kind not in kinds:
                allowed = ", ".join(kinds)
                raise ControlAuthError(403, f"a {found.kind} may not call this endpoint (allowed: {allowed})")
            return found

        return caller


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def same_host(url: str, ip: str | None) -> bool:
    """True when ``url``'s host is the address ``ip`` (both loopback counts); True when ``ip`` is unknown."""
    if ip is None:
        return True
    host = urlsplit(url).hostname or ""
    if _loopback(ip):
        return _loopback(host)
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(ip)
    except ValueError:
        return False  # a name, not an address: it cannot be held to the caller's


@dataclass
class ClientCredential:
    """The header a client sends: the shared secret (``secret``, presented as ``<kind>:<secret>``) or a token file
    (``path``, presented as read, re-read when its modification time or size changes)."""

    kind: Kind
    secret: str | None = None
    path: Path | None = None
    raw: bool = False  # a file holding a shared secret (False) or a token to present as is (True)
    _seen: tuple[float, int] | None = field(default=None, repr=False)
    _token: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, kind: Kind, env: Mapping[str, str] = os.environ) -> ClientCredential | None:
        """``$LLMFLEET_CONTROL_TOKEN`` (shared secret), else ``$LLMFLEET_CONTROL_TOKEN_FILE`` (projected token)."""
        if env.get(CONTROL_TOKEN_ENV):
            return cls(kind, secret=env[CONTROL_TOKEN_ENV])
        if env.get(CONTROL_TOKEN_FILE_ENV):
            return cls(kind, path=Path(env[CONTROL_TOKEN_FILE_ENV]), raw=True)
        return None

    def token(self) -> str:
        if self.secret is not None:
            return f"{self.kind}:{self.secret}"
        assert self.path is not None
        stat = self.path.stat()
        if self._seen != (stat.st_mtime, stat.st_size):
            self._token = self.path.read_text().strip()
            self._seen = (stat.st_mtime, stat.st_size)
        return self._token if self.raw else f"{self.kind}:{self._token}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}


class BearerAuth(httpx.Auth):
    """httpx auth adding a `ClientCredential`'s header to each request."""

    def __init__(self, credential: ClientCredential) -> None:
        self.credential = credential

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.credential.token()}"
        yield request


AUTH_MODES = ("none", "shared-secret", "kubernetes")
NO_CREDENTIAL = (
    f"no control credential: set ${CONTROL_TOKEN_ENV} (the fleet secret) for --auth shared-secret, run in a cluster "
    "for --auth kubernetes, or pass --auth none to run without authentication (anyone reaching the port is trusted)"
)


def default_mode(env: Mapping[str, str] = os.environ) -> str | None:
    """shared-secret when ``$LLMFLEET_CONTROL_TOKEN`` is set, else kubernetes in a cluster, else None: no credential
    (never ``none``: a fleet runs open only when told so, see `resolve_mode`)."""
    if env.get(CONTROL_TOKEN_ENV):
        return "shared-secret"
    return "kubernetes" if env.get("KUBERNETES_SERVICE_HOST") else None


def resolve_mode(flag: str | None, env: Mapping[str, str] = os.environ) -> str:
    """The ``--auth`` mode a process runs: ``flag`` when given, else `default_mode`; ValueError (`NO_CREDENTIAL`,
    naming the ways out) when neither gives one, so nothing runs unauthenticated without an explicit ``--auth none``."""
    mode = flag or default_mode(env)
    if mode is None:
        raise ValueError(NO_CREDENTIAL)
    return mode


def client_credential(kind: Kind, flag: str | None, env: Mapping[str, str] = os.environ) -> ClientCredential | None:
    """What a client of the control plane presents under ``--auth flag``: None for ``none``, the shared secret for
    ``shared-secret``, the projected token (``$LLMFLEET_CONTROL_TOKEN_FILE``) for ``kubernetes``, whichever the
    environment holds for no flag (`ClientCredential.from_env`); ValueError when that credential is missing."""
    if flag == "none":
        return None
    if flag == "shared-secret":
        env, missing = (
            {CONTROL_TOKEN_ENV: env.get(CONTROL_TOKEN_ENV, "")},
            f"--auth shared-secret needs ${CONTROL_TOKEN_ENV}",
        )
    elif flag == "kubernetes":
        env = {CONTROL_TOKEN_FILE_ENV: env.get(CONTROL_TOKEN_FILE_ENV, "")}
        missing = f"--auth kubernetes needs ${CONTROL_TOKEN_FILE_ENV} (a projected service-account token)"
    elif flag is None:
        missing = f"{NO_CREDENTIAL}; in a cluster ${CONTROL_TOKEN_FILE_ENV} names the projected token"
    else:
        raise ValueError(f"unknown auth mode {flag!r}; modes: {', '.join(AUTH_MODES)}")
    found = ClientCredential.from_env(kind, env)
    if found is None:
        raise ValueError(missing)
    if found.path is not None and not found.path.is_file():  # a mount missing: every report would be refused
        raise ValueError(f"${CONTROL_TOKEN_FILE_ENV} names {found.path}, which is no file: mount the projected token")
    return found


def make_verifier(mode: str, env: Mapping[str, str] = os.environ) -> Verifier | None:
    """The verifier of an ``--auth`` mode (None for ``none``); ValueError when its credential is missing."""
    if mode == "none":
        return None
    if mode == "shared-secret":
        if not env.get(CONTROL_TOKEN_ENV):
            raise ValueError(f"--auth shared-secret needs ${CONTROL_TOKEN_ENV}")
        return SharedSecret(env[CONTROL_TOKEN_ENV])
    if mode == "kubernetes":
        if not env.get("KUBERNETES_SERVICE_HOST"):
            raise ValueError("--auth kubernetes needs $KUBERNETES_SERVICE_HOST (run in a cluster)")
        return TokenReview.in_cluster()
    raise ValueError(f"unknown auth mode {mode!r}; modes: {', '.join(AUTH_MODES)}")


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the port spelt out), the key `OriginAuth` matches requests on."""
    parts = httpx.URL(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"{parts.scheme}://{parts.host}:{port}"


class OriginAuth(httpx.Auth):
    """Bearer tokens chosen by the request's origin: one client talks to the control plane with the control
    credential and to its engine with the engine key, and never sends either anywhere else."""

    def __init__(self, tokens: Mapping[str, Callable[[], str]]) -> None:
        self.tokens = {origin(url): token for url, token in tokens.items()}

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self.tokens.get(origin(str(request.url)))
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token()}"
        yield request


def operator_auth(control_plane: str, env: Mapping[str, str] = os.environ) -> OriginAuth | None:
    """httpx auth for an operator's reads and writes (``llmfleet status``, ``slo``, ``rollout``, ``up``'s own): the
    control-plane kind's credential from ``env``, sent to ``control_plane``'s origin only; None without one."""
    credential = ClientCredential.from_env(Kind.CONTROL_PLANE, env)
    return None if credential is None else OriginAuth({control_plane: credential.token})
