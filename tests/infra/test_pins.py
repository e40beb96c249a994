"""Chart and image pins: one constant each, used as is by the graph, and no older than the releases checked.

The floors are the releases whose manifests and values were read upstream: prometheus-community/helm-charts
@cf408a29 (prometheus-operator-crds 31.0.1), kubernetes-sigs/metrics-server tag metrics-server-helm-chart-3.13.1,
NVIDIA/k8s-device-plugin v0.19.3 (digest from NVIDIA/gpu-operator v26.3.3's bundle). A pin moved below them, or a
release that names a version other than its module's constant, fails here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleet.protocol import contract
from infra.lb_controller import LB_CONTROLLER_CHART_VERSION
from infra.metrics_server import METRICS_SERVER_CHART_VERSION, MetricsServerArgs, metrics_server_values
from infra.offline import OfflineRun
from infra.prometheus_crds import CRDS_CHART_VERSION
from tests.infra.conftest import stack_run

RELEASE = "kubernetes:helm.sh/v3:Release"
PINS = {
    "prometheus-operator-crds": CRDS_CHART_VERSION,
    "metrics-server": METRICS_SERVER_CHART_VERSION,
    "aws-load-balancer-controller": LB_CONTROLLER_CHART_VERSION,
}
FLOORS = {"prometheus-operator-crds": "31.0.1", "metrics-server": "3.13.1", "nvidia-device-plugin": "0.19.3"}
# Keys of metrics-server 3.13.1's values.yaml that the program sets (every other key keeps the chart's default).
METRICS_SERVER_KEYS = {"replicas", "podDisruptionBudget.enabled", "podDisruptionBudget.minAvailable", "nodeSelector"}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.removeprefix("v").split("."))


def _flat(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths to the leaves of ``values``, a mapping that names a label set (nodeSelector) being a leaf."""
    out: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        out |= _flat(value, f"{path}.") if isinstance(value, dict) and key != "nodeSelector" else {path}
    return out


@pytest.mark.parametrize("stack", ["prod", "dev"])
def test_every_release_pins_its_modules_version(stack: str) -> None:
    run: OfflineRun = stack_run(stack)
    releases = {r.props["chart"]: r.props.get("version") for r in run.of_type(RELEASE)}
    assert releases and set(releases) <= set(PINS)
    assert releases == {chart: PINS[chart] for chart in releases}


def test_the_device_plugin_runs_the_pinned_release_by_its_digest() -> None:
    match = re.fullmatch(
        r"nvcr\.io/nvidia/k8s-device-plugin:(v[\d.]+)@(sha256:[0-9a-f]{64})", contract.DEVICE_PLUGIN_SOURCE
    )
    assert match, contract.DEVICE_PLUGIN_SOURCE
    (daemonset,) = stack_run("prod").of_type("kubernetes:apps/v1:DaemonSet")
    (container,) = daemonset.props["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f"/{contract.IMAGE_DEVICE_PLUGIN}@{match[2]}")


@pytest.mark.parametrize(
    ("name", "pinned"),
    [
        ("prometheus-operator-crds", CRDS_CHART_VERSION),
        ("metrics-server", METRICS_SERVER_CHART_VERSION),
        ("nvidia-device-plugin", contract.DEVICE_PLUGIN_SOURCE.split(":")[1].split("@")[0]),
    ],
)
def test_pins_are_no_older_than_the_releases_checked_upstream(name: str, pinned: str) -> None:
    assert _version(pinned) >= _version(FLOORS[name])


def test_metrics_server_values_are_keys_of_the_pinned_chart() -> None:
    values = metrics_server_values(MetricsServerArgs({contract.LABEL_NODE_ROLE: "cpu"}))
    assert _flat(values) <= METRICS_SERVER_KEYS
