"""A control plane process with ``--auth shared-secret``: writes need the right credential of the right kind, reads
need a credential of any kind, a report claiming another host's engine or outside the bounds of a load never reaches
discovery, and without a credential or ``--auth none`` the process does not start."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.protocol.control_auth import CONTROL_TOKEN_ENV
from fleet.protocol.ports import free_port
from llmfleet.local.procs import Child
from tests.control_plane.builders import gateway_report, report
from tests.support import stacks
from tests.support.auth import NO_CREDENTIAL_ENV, assert_names_the_ways_out
from tests.support.procs import Proc

SECRET = secrets.token_hex(32)
POOL = stacks.spec("local").pools[0].name


def bearer(kind: str, secret: str = SECRET) -> dict[str, str]:
    return {"Authorization": f"Bearer {kind}:{secret}"}


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    port = free_port()
    argv = ["control-plane", "--stack", "local", "--port", str(port), "--dry-run", "--auth", "shared-secret"]
    log = tmp_path_factory.mktemp("cp") / "control-plane.log"
    proc = Proc(Child("control-plane", argv, log, env={CONTROL_TOKEN_ENV: SECRET}), f"http://127.0.0.1:{port}")
    try:
        proc.wait_http("/healthz")
        yield proc
    finally:
        proc.kill()


def replicas(cp: Proc) -> list[str]:
    answer = cp.get(f"/v1/pools/{POOL}/replicas", headers=bearer("gateway"))
    assert answer.status_code == 200
    return [r["replica"] for r in answer.json()["replicas"]]


def post_report(cp: Proc, replica: str, headers: dict[str, str], engine_url: str | None = None) -> tuple[int, Any]:
    body = report(replica, pool=POOL).model_dump(mode="json")
    body["engine_url"] = engine_url or f"http://127.0.0.1:9/{replica}"
    answer = cp.post("/v1/reports", json=body, headers=headers)
    return answer.status_code, answer.json()


def test_a_report_without_a_credential_is_401_and_never_listed(cp: Proc) -> None:
    status, body = post_report(cp, "no-credential", {})
    assert status == 401
    assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == 401
    assert "no-credential" not in replicas(cp)


def test_a_report_with_a_wrong_secret_is_401_and_never_listed(cp: Proc) -> None:
    status, _ = post_report(cp, "wrong-secret", bearer("agent", "not-the-secret"))
    assert status == 401
    status, _ = post_report(cp, "wrong-scheme", {"Authorization": f"Basic agent:{SECRET}"})
    assert status == 401
    assert {"wrong-secret", "wrong-scheme"}.isdisjoint(replicas(cp))


def test_a_report_from_a_gateway_credential_is_403(cp: Proc) -> None:
    status, body = post_report(cp, "as-gateway", bearer("gateway"))
    assert status == 403
    assert body["error"]["type"] == "permission_error"
    assert "as-gateway" not in replicas(cp)


def test_a_report_claiming_another_hosts_engine_is_403_and_never_listed(cp: Proc) -> None:
    status, body = post_report(cp, "hijack", bearer("agent"), engine_url="http://10.9.8.7:8000")
    assert status == 403
    assert body["error"]["param"] == "engine_url"
    assert "hijack" not in replicas(cp)


def test_a_report_with_the_agent_credential_from_its_own_host_is_listed(cp: Proc) -> None:
    status, _ = post_report(cp, "honest", bearer("agent"), engine_url="http://127.0.0.1:8123")
    assert status == 200
    assert "honest" in replicas(cp)


def test_gateway_reports_need_a_gateway_credential(cp: Proc) -> None:
    body = gateway_report(pool=POOL).model_dump(mode="json")
    assert cp.post("/v1/gateway-reports", json=body).status_code == 401
    assert cp.post("/v1/gateway-reports", json=body, headers=bearer("agent")).status_code == 403
    assert cp.post("/v1/gateway-reports", json=body, headers=bearer("gateway")).status_code == 200


def test_leases_need_an_agent_credential_and_a_replica_that_reported_from_the_callers_address(cp: Proc) -> None:
    request = {"pool": POOL, "replica": "r-lease"}
    assert cp.post("/v1/leases/restart", json=request).status_code == 401
    assert cp.post("/v1/leases/restart", json=request, headers=bearer("gateway")).status_code == 403
    refused = cp.post("/v1/leases/restart", json=request, headers=bearer("agent"))
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "replica"  # it never reported
    assert post_report(cp, "r-lease", bearer("agent"))[0] == 200
    assert cp.post("/v1/leases/restart", json=request, headers=bearer("agent")).status_code == 200
    leases = cp.get("/v1/leases", headers=bearer("agent")).json()
    assert "r-lease" in str(leases)


def test_shared_secret_mode_without_the_secret_exits_2(tmp_path: Path) -> None:
    argv = ["control-plane", "--stack", "local", "--port", "0", "--auth", "shared-secret"]
    proc = Proc(Child("control-plane", argv, tmp_path / "cp.log", env={CONTROL_TOKEN_ENV: ""}))
    try:
        assert proc.wait(30) == 2
        assert CONTROL_TOKEN_ENV in proc.text()
    finally:
        proc.kill()


READS = [f"/v1/pools/{POOL}/replicas", "/v1/pools", f"/v1/pools/{POOL}/budget", "/v1/decisions", "/v1/leases",
         "/v1/aliases", "/v1/rollouts"]  # fmt: skip


@pytest.mark.parametrize("path", READS)
def test_a_read_without_a_valid_credential_is_401(cp: Proc, path: str) -> None:
    for headers in ({}, bearer("gateway", "not-the-secret")):
        answer = cp.get(path, headers=headers)
        assert answer.status_code == 401, (path, headers, answer.text)
        assert answer.json()["error"]["type"] == "authentication_error"
        assert answer.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("kind", ["agent", "gateway", "control-plane"])
def test_any_fleet_member_may_read_the_replica_list(cp: Proc, kind: str) -> None:
    assert cp.get(f"/v1/pools/{POOL}/replicas", headers=bearer(kind)).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_probes_and_metrics_need_no_credential(cp: Proc, path: str) -> None:
    assert cp.get(path).status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("waiting", -1),
        ("running", 10**7),
        ("kv_usage", 1.5),
        ("prefix_hit_rate", -0.1),
        ("ttft_p99_s", float("nan")),
        ("tokens_per_s", float("inf")),
        ("uptime_s", -5.0),
        ("restarts", -1),
        ("ts", 1e12),
        ("replica", ""),
        ("model", "m" * 5000),
    ],
)
def test_a_report_outside_the_bounds_is_400_naming_the_field_and_never_listed(
    cp: Proc, field: str, value: object
) -> None:
    body = report(f"bounds-{field}", pool=POOL).model_dump(mode="json")
    body["engine_url"] = "http://127.0.0.1:9/bounds"
    body[field] = value
    # json.dumps writes NaN and Infinity as JavaScript does (httpx's json= refuses them): a hostile reporter could.
    headers = {**bearer("agent"), "Content-Type": "application/json"}
    answer = cp.post("/v1/reports", content=json.dumps(body), headers=headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert f"bounds-{field}" not in replicas(cp)


def test_without_a_credential_or_auth_none_it_exits_2_naming_the_ways_out(tmp_path: Path) -> None:
    argv = ["control-plane", "--stack", "local", "--port", "0", "--dry-run"]
    proc = Proc(Child("control-plane", argv, tmp_path / "cp.log", env=NO_CREDENTIAL_ENV))
    try:
        assert proc.wait(30) == 2
        assert_names_the_ways_out(proc.text())
        assert "listening on" not in proc.text()
    finally:
        proc.kill()


def test_auth_none_given_explicitly_runs_open_with_a_warning(tmp_path: Path) -> None:
    port = free_port()
    argv = ["control-plane", "--stack", "local", "--port", str(port), "--dry-run", "--auth", "none"]
    proc = Proc(Child("control-plane", argv, tmp_path / "cp.log", env=NO_CREDENTIAL_ENV), f"http://127.0.0.1:{port}")
    try:
        proc.wait_http("/healthz")
        assert proc.get(f"/v1/pools/{POOL}/replicas").status_code == 200
        assert "control auth is OFF" in proc.text()
    finally:
        proc.kill()
