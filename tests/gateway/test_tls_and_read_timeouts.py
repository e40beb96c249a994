"""The gateway process serves HTTPS with --tls-cert/--tls-key (stalled clients: tests/gateway/test_edge_stalls.py)."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import trustme

from tests.support.procs import Proc, Procs
from tests.support.stacks import KEYS, MODEL, write_stack


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
