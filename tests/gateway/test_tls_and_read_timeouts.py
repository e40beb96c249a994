"""The gateway process serves HTTPS with --tls-cert/--tls-key, and closes clients that send their request slowly."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import trustme

from tests.support.procs import Proc, Procs
from tests.support.stacks import KEYS, MODEL, write_stack

HEADER_READ_S = 1.5


@pytest.fixture
def ca(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    """A throw-away CA, and a certificate for 127.0.0.1 it signed: (ca, chain PEM, key PEM)."""
    authority = trustme.CA()
    cert = authority.issue_cert("127.0.0.1", "localhost")
    chain, key = tmp_path / "gateway.crt", tmp_path / "gateway.key"
    cert.private_key_pem.write_to_path(str(key))
    cert.cert_chain_pems[0].write_to_path(str(chain))
    return authority, chain, key


def test_the_openai_client_streams_over_https_from_a_gateway_with_a_test_ca(
    ca: tuple[trustme.CA, Path, Path], shared_sim: Proc, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> None:
    authority, chain, key = ca
    stack = write_stack(tmp_path / "Pulumi.tls.yaml", "gateway")
    gateway = gateway_procs(stack, [shared_sim.url], "--tls-cert", str(chain), "--tls-key", str(key))
    assert gateway.url.startswith("https://")
    trust = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(trust))
    with httpx.Client(verify=ssl.create_default_context(cafile=str(trust))) as http:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["gold"], http_client=http)
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True
            )
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # A client that does not trust the CA is refused at the handshake.
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["gold"], max_retries=0).models.list()


def test_a_certificate_without_its_key_is_refused_at_start(
    ca: tuple[trustme.CA, Path, Path], procs: Procs, tmp_path: Path
) -> None:
    _, chain, _ = ca
    stack = write_stack(tmp_path / "Pulumi.tls.yaml", "gateway")
    proc = procs.start(["gateway", "--stack", str(stack), "--port", "0", "--tls-cert", str(chain)], name="gw")
    assert proc.process.wait(timeout=30) == 2
    assert "--tls-cert and --tls-key go together" in proc.text()


async def test_a_request_that_stalls_mid_headers_is_closed_within_the_header_read_timeout(
    shared_sim: Proc, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> None:
    stack = write_stack(tmp_path / "Pulumi.slow.yaml", "gateway", **{"gateway.timeouts.headerReadS": HEADER_READ_S})
    gateway = gateway_procs(stack, [shared_sim.url])
    host, port = gateway.url.split("://", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bea")  # and no more
    await writer.drain()
    # The gateway closes the connection: read() returns b"" (EOF). A generous bound catches a gateway that never does.
    tail = await asyncio.wait_for(reader.read(), timeout=HEADER_READ_S + 20)
    elapsed = time.monotonic() - started
    writer.close()
    assert tail == b"" or tail.startswith(b"HTTP/1.1 4"), tail
    assert elapsed < HEADER_READ_S + 5, f"closed after {elapsed:.1f} s"


async def test_a_body_that_stalls_gets_a_408_within_the_body_read_timeout(
    shared_sim: Proc, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> None:
    stack = write_stack(tmp_path / "Pulumi.slow.yaml", "gateway", **{"gateway.timeouts.bodyReadS": 1.0})
    gateway = gateway_procs(stack, [shared_sim.url])
    host, port = gateway.url.split("://", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {KEYS['gold']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    writer.write(head.encode() + b'{"model": ')  # 10 of the 100 bytes promised
    await writer.drain()
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout=20)
    writer.close()
    assert answer.split()[1] == b"408", answer
