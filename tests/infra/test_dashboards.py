"""Grafana dashboards: generated from the stack, committed as generated, deployed as sidecar ConfigMaps, and every
query parses (promtool) and names only series the fleet's processes export (`fleet.slo.promql_names`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from agent.metrics import AgentMetrics
from control_plane.api.app import create_app
from control_plane.plane import ControlPlane
from engine_sim.metrics import EngineMetricsRecorder
from fleet.capacity.plan import plan_pool
from fleet.protocol.clock import SystemClock
from fleet.slo.promql_names import missing_series
from fleet.spec.stack import FleetSpec
from gateway.metrics import GatewayMetrics
from infra.dashboards import DASHBOARDS, build_dashboards, dashboard_text
from infra.dashboards.configmaps import FOLDER_ANNOTATION, SIDECAR_LABEL
from infra.dashboards.panels import dashboard_uid, substitute
from infra.offline import OfflineRun
from infra.stack_run import offline_run
from llmfleet.cli import main
from tests.support.stacks import stack_document

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "dashboards" / "prod"
REGENERATE = "llmfleet dashboards --stack prod"
# What Grafana would put in place of its own variables; any concrete window parses the same.
BUILTINS = {"__rate_interval": "1m", "__interval": "1m"}


# -- helpers: what the checks compare ---------------------------------------------------------------------------


def stale_dashboards(spec: FleetSpec, folder: Path) -> list[str]:
    """Files in ``folder`` that differ from a fresh generation, are missing, or are left over."""
    fresh = {f"{name}.json": dashboard_text(model) for name, model in build_dashboards(spec).items()}
    on_disk = {p.name: p.read_text() for p in folder.glob("*.json")} if folder.is_dir() else {}
    return sorted(name for name in fresh.keys() | on_disk.keys() if fresh.get(name) != on_disk.get(name))


def queries(model: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) for every panel target and annotation of a dashboard."""
    for panel in model.get("panels", []):
        for target in panel.get("targets", []):
            yield f"{model['title']} / {panel['title']} / {target['refId']}", target["expr"]
    for note in model.get("annotations", {}).get("list", []):
        yield f"{model['title']} / annotation {note['name']}", note["expr"]


def concrete(model: dict[str, Any], expr: str) -> str:
    """``expr`` with the dashboard's variables at their current values and Grafana's own given a window."""
    values = {v["name"]: str((v.get("current") or {}).get("value", "")) for v in model["templating"]["list"]}
    return substitute(expr, {**values, **BUILTINS})


def promtool_errors(exprs: dict[str, str], folder: Path) -> str | None:
    """promtool's complaint about ``exprs`` written as recording rules (None: they all parse)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is not installed (CI installs prometheus for it)")
        pytest.skip("promtool is not installed")
    rules = [{"record": f"llmfleet_dashboard_check:q{i}", "expr": expr} for i, expr in enumerate(exprs.values())]
    path = folder / "dashboard-queries.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return None if result.returncode == 0 else result.stdout + result.stderr


@pytest.fixture(scope="module")
def expositions(prod_spec: FleetSpec) -> list[str]:
    """The ``/metrics`` text of each of the fleet's four exporters, from their own registries (a labelled family
    with no child yet still shows its ``# TYPE`` line, which is what `fleet.slo.promql_names` reads)."""
    control = ControlPlane.build(prod_spec, SystemClock())
    create_app(control)  # registers the control plane's series on control.metrics
    engine = EngineMetricsRecorder("qwen2.5-7b-instruct", 8192, {"block_size": "16"})
    registries = [engine.registry, GatewayMetrics().registry, AgentMetrics("r0", "qwen-7b").registry, control.metrics]
    return [generate_latest(r).decode() for r in registries]


@pytest.fixture(scope="module")
def dashboards(prod_spec: FleetSpec) -> dict[str, dict[str, Any]]:
    return build_dashboards(prod_spec)


# -- generation -------------------------------------------------------------------------------------------------


def test_committed_prod_dashboards_are_what_the_generator_writes(prod_spec: FleetSpec) -> None:
    stale = stale_dashboards(prod_spec, COMMITTED)
    assert not stale, f"dashboards/prod is out of date ({', '.join(stale)}); run: {REGENERATE}"


def test_the_command_writes_one_json_file_per_dashboard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "--stack", "prod", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.json" for name in DASHBOARDS)
    assert main(["dashboards", "--stack", "no-such-stack", "--out", str(tmp_path / "x")]) == 1
    assert "no stack 'no-such-stack'" in capsys.readouterr().err


def test_an_edited_or_missing_dashboard_file_is_reported(prod_spec: FleetSpec, tmp_path: Path) -> None:
    for name, model in build_dashboards(prod_spec).items():
        (tmp_path / f"{name}.json").write_text(dashboard_text(model))
    assert stale_dashboards(prod_spec, tmp_path) == []
    (tmp_path / "pool.json").write_text("{}\n")
    (tmp_path / "tenant.json").unlink()
    assert stale_dashboards(prod_spec, tmp_path) == ["pool.json", "tenant.json"]


def test_uids_are_stable_and_derived_from_environment_and_name(prod_spec: FleetSpec) -> None:
    first, second = build_dashboards(prod_spec), build_dashboards(prod_spec)
    assert first == second
    assert {m["uid"] for m in first.values()} == {f"llmfleet-prod-{name}" for name in DASHBOARDS}
    long = dashboard_uid("a-very-long-environment-name-for-a-stack", "fleet-overview")
    assert len(long) == 40 and long == dashboard_uid("a-very-long-environment-name-for-a-stack", "fleet-overview")
    assert long != dashboard_uid("a-very-long-environment-name-for-a-stack", "pool")


def test_every_panel_queries_the_datasource_variable(dashboards: dict[str, dict[str, Any]]) -> None:
    for model in dashboards.values():
        (source,) = [v for v in model["templating"]["list"] if v["name"] == "datasource"]
        assert (source["type"], source["query"]) == ("datasource", "prometheus")
        for panel in model["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_pool_and_tenant_dashboards_offer_the_stacks_pools_and_tenants(
    dashboards: dict[str, dict[str, Any]], prod_spec: FleetSpec
) -> None:
    variables = {(d, v["name"]): v for d, m in dashboards.items() for v in m["templating"]["list"]}
    assert variables["pool", "pool"]["query"] == ",".join(p.name for p in prod_spec.pools)
    assert variables["tenant", "tenant"]["query"] == ",".join(t.name for t in prod_spec.tenants)
    assert all("$pool" in expr for _, expr in queries(dashboards["pool"]))


def _panel(model: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in model["panels"] if p["title"] == title)


def _threshold_values(panel: dict[str, Any]) -> list[float]:
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


def test_fleet_overview_draws_the_stacks_slos_and_plan(
    dashboards: dict[str, dict[str, Any]], prod_spec: FleetSpec
) -> None:
    overview = dashboards["fleet-overview"]
    pool = prod_spec.pools[0]
    assert _threshold_values(_panel(overview, f"Availability: {pool.name}")) == [0.999]
    assert _threshold_values(_panel(overview, f"TTFT P99: {pool.name}")) == [0.3]
    assert _threshold_values(_panel(overview, f"Inter-token latency P99: {pool.name}")) == [pytest.approx(1 / 30)]
    (budget,) = _panel(overview, f"Error budget left (30d): {pool.name}")["targets"]
    assert budget["expr"].startswith("1 - ") and "[30d]" in budget["expr"]
    assert budget["expr"].endswith("/ (1 - 0.999)")
    plan = plan_pool(prod_spec, pool)
    replicas = [t["expr"] for t in _panel(overview, f"Replicas: {pool.name}")["targets"]]
    for count in (plan.replicas_min, plan.replicas_peak, plan.replicas_max):
        assert f"vector({count})" in replicas
    (scaling,) = overview["annotations"]["list"]
    assert scaling["expr"] == "changes(llmfleet_autoscaler_target_replicas[1m]) > 0"


# -- the queries: they parse, and they name exported series -----------------------------------------------------


def test_every_query_parses_with_promtool(dashboards: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    exprs = {where: concrete(m, expr) for m in dashboards.values() for where, expr in queries(m)}
    assert len(exprs) > 30
    assert promtool_errors(exprs, tmp_path) is None


def test_promtool_check_fails_on_an_unbalanced_parenthesis(tmp_path: Path) -> None:
    errors = promtool_errors({"broken": "sum(rate(llmfleet_gateway_requests_total[1m])"}, tmp_path)
    assert errors is not None and "parse error" in errors


def test_every_query_names_only_series_the_fleet_exports(
    dashboards: dict[str, dict[str, Any]], expositions: list[str]
) -> None:
    exprs = [concrete(m, expr) for m in dashboards.values() for _, expr in queries(m)]
    assert missing_series(exprs, expositions) == []


def test_a_misspelled_metric_is_caught(expositions: list[str]) -> None:
    expr = "sum(rate(llmfleet_gateway_request_total[5m]))"  # the counter is llmfleet_gateway_requests_total
    assert missing_series([expr], expositions) == [f"llmfleet_gateway_request_total in {expr!r}"]


# -- deployment: ConfigMaps for Grafana's sidecar ---------------------------------------------------------------


def _dashboard_configmaps(run: OfflineRun) -> list[Any]:
    return [r for r in run.of_type("kubernetes:core/v1:ConfigMap") if SIDECAR_LABEL in r.props["metadata"]["labels"]]


def test_prod_deploys_one_sidecar_configmap_per_dashboard(prod: OfflineRun, prod_spec: FleetSpec) -> None:
    maps = _dashboard_configmaps(prod)
    assert len(maps) == len(DASHBOARDS)
    uids = set()
    for cm in maps:
        metadata = cm.props["metadata"]
        assert metadata["namespace"] == prod_spec.observability.prometheus_namespace == "monitoring"
        assert metadata["labels"][SIDECAR_LABEL] == "1"
        assert metadata["annotations"][FOLDER_ANNOTATION] == "llmfleet"
        ((key, text),) = cm.props["data"].items()
        model = json.loads(text)
        assert key == f"{model['uid']}.json"
        uids.add(model["uid"])
    assert uids == {f"llmfleet-prod-{name}" for name in DASHBOARDS}


def test_a_stack_without_grafana_gets_no_dashboard_configmaps() -> None:
    run = offline_run(stack_document("dev", **{"observability.grafanaDashboards": False}), "dev")
    assert _dashboard_configmaps(run) == []
