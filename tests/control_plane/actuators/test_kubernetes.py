"""Kubernetes actuator against a real loopback HTTP server that speaks the scale subresource."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from control_plane.actuators import ActuatorEnv, build_actuator
from control_plane.actuators.kubernetes import DELETION_COST, KubernetesActuator, KubernetesError, in_cluster_client
from control_plane.scaling.decisions import ScaleDown, ScaleUp
from fleet.protocol.control_auth import CONTROL_TOKEN_ENV
from fleet.spec.loader import load_spec

NS = "llmfleet-dev"
SCALE_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/llmfleet-qwen-7b/scale"


def scale_object(replicas: int) -> dict[str, Any]:
    """An autoscaling/v1 Scale as the API server returns it."""
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": "llmfleet-qwen-7b", "namespace": NS},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "selector": "app=qwen-7b"},
    }


class ApiServer:
    """Captures every request; serves the scale subresource and pod patches of one Deployment."""

    def __init__(self) -> None:
        self.replicas = 2
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "content_type": request.headers.get("Content-Type"),
                "body": json.loads(body) if body else None,
            }
        )
        if request.path == SCALE_PATH:
            if request.method == "PATCH":
                self.replicas = json.loads(body)["spec"]["replicas"]
            return web.json_response(scale_object(self.replicas))
        if request.path.startswith(f"/api/v1/namespaces/{NS}/pods/") and request.method == "PATCH":
            return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": json.loads(body)["metadata"]})
        if request.path.startswith(f"/api/v1/namespaces/{NS}/pods/") and request.method == "GET":
            name = request.path.rsplit("/", 1)[1]
            status = {"phase": "Running", "podIP": "127.0.0.1"} if name != "pod-unscheduled" else {"phase": "Pending"}
            return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name}, "status": status})
        return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServer, str]]:
    server = ApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield server, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.fixture
async def agent() -> AsyncIterator[tuple[list[tuple[str, str | None]], int]]:
    """An agent's control endpoints on loopback: records each POST's path and Authorization header."""
    calls: list[tuple[str, str | None]] = []

    async def command(request: web.Request) -> web.Response:
        calls.append((request.path, request.headers.get("Authorization")))
        return web.json_response({"accepted": True}, status=202)

    app = web.Application()
    app.router.add_post("/{command}", command)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield calls, runner.addresses[0][1]
    await runner.cleanup()


def check_scale_patch(request: dict[str, Any], replicas: int) -> None:
    """A scale PATCH: merge patch whose body is a partial autoscaling/v1 Scale (only spec.replicas)."""
    assert request["method"] == "PATCH" and request["path"] == SCALE_PATH
    assert request["content_type"] == "application/merge-patch+json"
    assert request["body"] == {"spec": {"replicas": replicas}}
    assert isinstance(request["body"]["spec"]["replicas"], int)


async def test_current_and_scale_up_use_the_scale_subresource(api: tuple[ApiServer, str]) -> None:
    server, url = api
    spec = load_spec("dev").spec
    env = ActuatorEnv("dev", "http://cp", kubernetes_client=httpx.AsyncClient(base_url=url))
    actuator = build_actuator(spec, env, dry_run=False)
    pool = spec.pool("qwen-7b")
    assert (await actuator.current(pool)).target == 2
    await actuator.apply(ScaleUp("qwen-7b", current=2, target=3, reason="queue", at=0.0))
    assert server.requests[0]["method"] == "GET" and server.requests[0]["path"] == SCALE_PATH
    check_scale_patch(server.requests[1], 3)
    assert (await actuator.current(pool)).target == 3
    await actuator.close()


async def test_scale_down_marks_victims_with_deletion_cost_before_patching_scale(api: tuple[ApiServer, str]) -> None:
    server, url = api
    spec = load_spec("dev").spec
    env = ActuatorEnv("dev", "http://cp", kubernetes_client=httpx.AsyncClient(base_url=url))
    actuator = build_actuator(spec, env, dry_run=False)
    decision = ScaleDown("qwen-7b", current=3, target=1, reason="idle", at=0.0, victims=("pod-b", "pending-0"))
    await actuator.apply(decision)
    annotate, patch = server.requests
    assert annotate["method"] == "PATCH" and annotate["path"] == f"/api/v1/namespaces/{NS}/pods/pod-b"
    assert annotate["content_type"] == "application/merge-patch+json"
    assert annotate["body"] == {"metadata": {"annotations": {DELETION_COST: "-1000"}}}
    check_scale_patch(patch, 1)
    await actuator.close()


async def test_sleep_mode_sleeps_and_wakes_agents_at_their_pod_ip_and_keeps_sleeping_pods_counted(
    api: tuple[ApiServer, str], agent: tuple[list[tuple[str, str | None]], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, url = api
    calls, port = agent
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "fleet-secret")
    spec = load_spec("dev").spec
    actuator = KubernetesActuator(spec, httpx.AsyncClient(base_url=url), agent_port=port)
    # 3 awake -> 1: pod-a sleeps, pod-b drains away; the Deployment keeps 2 (1 awake, 1 asleep).
    down = ScaleDown(
        "qwen-7b", current=3, target=1, reason="idle", at=0.0, asleep=1, victims=("pod-b",), sleep=("pod-a",)
    )
    await actuator.apply(down)
    assert calls == [("/sleep", "Bearer control-plane:fleet-secret")]
    annotated = [r["path"] for r in server.requests if r["method"] == "PATCH" and "/pods/" in r["path"]]
    assert annotated == [f"/api/v1/namespaces/{NS}/pods/pod-b"]  # never the sleeping pod
    check_scale_patch(server.requests[-1], 2)
    # 1 awake -> 3: pod-a wakes and one pod starts; 3 in all, none asleep.
    await actuator.apply(ScaleUp("qwen-7b", current=1, target=3, reason="queue", at=1.0, wake=("pod-a",)))
    assert calls[-1] == ("/wake", "Bearer control-plane:fleet-secret")
    check_scale_patch(server.requests[-1], 3)
    await actuator.close()


async def test_an_agent_without_a_pod_ip_is_skipped_and_the_count_still_follows(
    api: tuple[ApiServer, str], agent: tuple[list[tuple[str, str | None]], int]
) -> None:
    server, url = api
    calls, port = agent
    actuator = KubernetesActuator(load_spec("dev").spec, httpx.AsyncClient(base_url=url), agent_port=port)
    await actuator.apply(ScaleUp("qwen-7b", current=1, target=2, reason="queue", at=0.0, wake=("pod-unscheduled",)))
    assert calls == []
    check_scale_patch(server.requests[-1], 2)
    await actuator.close()


async def test_dry_run_reads_but_never_writes(api: tuple[ApiServer, str]) -> None:
    server, url = api
    spec = load_spec("dev").spec  # the dev stack says dryRun: true
    env = ActuatorEnv("dev", "http://cp", kubernetes_client=httpx.AsyncClient(base_url=url))
    actuator = build_actuator(spec, env)
    await actuator.current(spec.pool("qwen-7b"))
    await actuator.apply(ScaleUp("qwen-7b", current=2, target=4, reason="queue", at=0.0))
    assert [r["method"] for r in server.requests] == ["GET"]
    await actuator.close()


async def test_api_errors_raise_with_status(api: tuple[ApiServer, str]) -> None:
    _, url = api
    spec = load_spec("dev").spec
    actuator = KubernetesActuator(spec, httpx.AsyncClient(base_url=url), deployment_name=lambda pool: f"missing-{pool}")
    with pytest.raises(KubernetesError, match="HTTP 404"):
        await actuator.current(spec.pool("qwen-7b"))
    await actuator.close()


async def test_in_cluster_client_sends_a_rotated_token_on_the_next_request(tmp_path: Path) -> None:
    """kubelet rewrites the projected token file; the next request carries the new token, not the one at start."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        return httpx.Response(200, json=scale_object(2))

    token = tmp_path / "token"
    token.write_text("token-one\n")
    os.utime(token, (1_000, 1_000))
    env = {"KUBERNETES_SERVICE_HOST": "10.100.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    client = in_cluster_client(tmp_path, env, transport=httpx.MockTransport(handler))
    async with client:
        await client.get(SCALE_PATH)
        token.write_text("token-two\n")  # same size: only the modification time tells it changed
        os.utime(token, (2_000, 2_000))
        await client.get(SCALE_PATH)
    assert seen == ["Bearer token-one", "Bearer token-two"]
