"""The SLO rules and PodMonitors carry the labels the cluster's Prometheus selects them by.

kube-prometheus-stack renders its Prometheus with ``ruleSelector``/``podMonitorSelector`` ``matchLabels:
{release: <release name>}`` when those values are left empty (``*SelectorNilUsesHelmValues: true``,
prometheus-community/helm-charts charts/kube-prometheus-stack/templates/prometheus/prometheus.yaml), and its
namespace selectors are ``{}`` (every namespace): an object without the label is never loaded.
"""

from __future__ import annotations

from typing import Any

import pytest

from infra.offline import OfflineRun
from infra.stack_run import offline_run
from tests.infra.conftest import stack_run
from tests.support.stacks import assert_refused, stack_document

RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
KUBE_PROMETHEUS_STACK = {"release": "kube-prometheus-stack"}  # a release named after the chart


def _selected(run: OfflineRun, match_labels: dict[str, str]) -> tuple[int, int]:
    """How many of the run's rules and monitors a selector ``{matchLabels: match_labels}`` picks, of how many."""
    objects = [*run.of_type(RULE), *run.of_type(MONITOR)]
    labels: list[dict[str, Any]] = [o.props["metadata"].get("labels", {}) for o in objects]
    return sum(all(have.get(k) == v for k, v in match_labels.items()) for have in labels), len(objects)


@pytest.mark.parametrize("stack", ["prod", "staging", "dev"])
def test_a_default_kube_prometheus_stack_release_selects_every_rule_and_monitor(stack: str) -> None:
    selected, total = _selected(stack_run(stack), KUBE_PROMETHEUS_STACK)
    assert total > 3 and selected == total


def test_the_stack_names_the_labels_its_prometheus_selects() -> None:
    labels = {"prometheus": "fleet", "team.example.com/owner": "ml"}
    run = offline_run(stack_document("dev", **{"observability.prometheusSelectorLabels": labels}), "dev")
    assert _selected(run, labels)[0] == _selected(run, labels)[1] > 3
    assert _selected(run, KUBE_PROMETHEUS_STACK)[0] == 0  # replaced, not added to
    (rule, *_) = run.of_type(RULE)
    assert "llmfleet.io/pool" in rule.props["metadata"]["labels"]  # the fleet's own labels stay


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"bad key!": "x"}, "not a Kubernetes label key"),
        ({"release": "has space"}, "not a Kubernetes label value"),
        ({"release": "x" * 64}, "not a Kubernetes label value"),
        ({"llmfleet.io/pool": "x"}, "its own llmfleet.io labels"),
    ],
)
def test_selector_labels_must_be_kubernetes_labels(labels: dict[str, str], message: str) -> None:
    document = stack_document("dev", **{"observability.prometheusSelectorLabels": labels})
    assert_refused(document, "Pulumi.dev.yaml", "observability.prometheusSelectorLabels", message)
