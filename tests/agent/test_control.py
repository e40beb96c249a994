"""The control-plane client against a real HTTP receiver: reports, lease grant/refusal/release, outages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from agent.control import ControlClient, ControlPlaneUnavailable, LeaseRefused
from fleet.protocol.wire import LoadReport
from tests.agent.receiver import Receiver


def report(replica: str = "r0") -> LoadReport:
    return LoadReport(
        replica=replica,
        pool="qwen-7b",
        engine_url="http://e",
        state="ready",
        model="m",
        engine_version="0.33.0",
        ts=1.0,
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def test_report_is_delivered(receiver: Receiver, http: httpx.AsyncClient) -> None:
    await ControlClient(http, receiver.url).report(report())
    assert [r.replica for r in receiver.reports] == ["r0"]


async def test_lease_is_granted_then_refused_to_a_second_replica_until_released(
    receiver: Receiver, http: httpx.AsyncClient
) -> None:
    client = ControlClient(http, receiver.url)
    grant = await client.acquire_lease("qwen-7b", "r0", ttl_s=30)
    assert (grant.pool, grant.replica, grant.holders) == ("qwen-7b", "r0", ["r0"])
    with pytest.raises(LeaseRefused):
        await client.acquire_lease("qwen-7b", "r1", ttl_s=30)
    await client.release_lease("qwen-7b", "r0")
    assert (await client.acquire_lease("qwen-7b", "r1", ttl_s=30)).holders == ["r1"]
    await client.release_lease("qwen-7b", "r0")  # already gone (404) is not an error


@pytest.mark.parametrize("status", [500, 503])
async def test_server_errors_mean_unavailable(receiver: Receiver, http: httpx.AsyncClient, status: int) -> None:
    receiver.fail_with = status
    client = ControlClient(http, receiver.url)
    with pytest.raises(ControlPlaneUnavailable):
        await client.report(report())
    with pytest.raises(ControlPlaneUnavailable):
        await client.acquire_lease("qwen-7b", "r0", ttl_s=None)


async def test_nothing_listening_means_unavailable(receiver: Receiver, http: httpx.AsyncClient) -> None:
    url = receiver.url
    await receiver.stop()
    client = ControlClient(http, url)
    with pytest.raises(ControlPlaneUnavailable):
        await client.report(report())
    with pytest.raises(ControlPlaneUnavailable):
        await client.acquire_lease("qwen-7b", "r0", ttl_s=None)


async def test_no_control_plane_configured(http: httpx.AsyncClient) -> None:
    with pytest.raises(ControlPlaneUnavailable, match="no control plane"):
        await ControlClient(http, None).report(report())
