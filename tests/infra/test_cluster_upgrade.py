"""The cluster's version policy and upgrade path: standard support only, nodes and add-ons on the cluster's version.

EKS end-of-standard-support dates from https://endoflife.date/amazon-eks (each minor version gets 14 months of
standard support, https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import pytest

from fleet.spec.loader import list_stacks, load_spec
from fleet.spec.stack import ClusterSpec
from tests.infra.conftest import stack_run
from tests.infra.registrations import registrations

CLUSTER = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ADDON = "aws:eks/addon:Addon"
AWS_STACKS = [s for s in list_stacks() if load_spec(s).spec.target == "aws"]

END_OF_STANDARD_SUPPORT = {
    "1.32": datetime.date(2026, 3, 23),
    "1.33": datetime.date(2026, 7, 29),
    "1.34": datetime.date(2026, 12, 2),
    "1.35": datetime.date(2027, 3, 27),
}
# The release these defaults ship in must not land in extended support ($0.60 instead of $0.10 a cluster-hour)
# within a quarter of this date.
REVIEWED = datetime.date(2026, 12, 1)


def _in_standard_support_for_a_quarter(version: str) -> bool:
    return END_OF_STANDARD_SUPPORT.get(version, datetime.date.max) > REVIEWED + datetime.timedelta(days=90)


def test_the_default_kubernetes_version_stays_in_standard_support() -> None:
    assert _in_standard_support_for_a_quarter(ClusterSpec().kubernetes_version)


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_shipped_stacks_run_a_version_in_standard_support_and_never_enter_extended_support(stack: str) -> None:
    (cluster,) = stack_run(stack).of_type(CLUSTER)
    assert _in_standard_support_for_a_quarter(cluster.props["version"])
    assert cluster.props["upgradePolicy"] == {"supportType": "STANDARD"}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_node_group_runs_the_clusters_version_and_waits_for_the_cluster(stack: str) -> None:
    run = stack_run(stack)
    (cluster,) = run.of_type(CLUSTER)
    groups = run.of_type(NODE_GROUP)
    assert groups
    for group in groups:
        # Without `version` the provider never notices a node group left behind by a control-plane upgrade.
        assert group.props["version"] == cluster.props["version"]
        assert run.depends_on(group, cluster)  # so an upgrade moves the control plane first


def _addon_versions(args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "addonName": args["addonName"],
        "kubernetesVersion": args["kubernetesVersion"],
        "version": f"v-{args['addonName']}-for-{args['kubernetesVersion']}",
        "id": args["addonName"],
    }


def test_core_addons_are_managed_at_the_default_build_for_the_clusters_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = registrations(monkeypatch, invokes={"aws:eks/getAddonVersion:getAddonVersion": _addon_versions}).run
    (cluster,) = run.of_type(CLUSTER)
    version = cluster.props["version"]
    addons = {a.props["addonName"]: a for a in run.of_type(ADDON)}
    assert {"vpc-cni", "kube-proxy", "coredns"} <= set(addons)
    for name in ("vpc-cni", "kube-proxy", "coredns"):
        assert addons[name].props["addonVersion"] == f"v-{name}-for-{version}"
        assert addons[name].props["resolveConflictsOnUpdate"] == "OVERWRITE"
    # CoreDNS needs a node it may run on (no GPU taint toleration): it waits for the CPU group.
    (cpu,) = [g for g in run.of_type(NODE_GROUP) if g.props["labels"].get("llmfleet.io/node-role") == "cpu"]
    assert run.depends_on(addons["coredns"], cpu)


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_gpu_root_volumes_hold_only_the_os(stack: str) -> None:
    """Images, pod volumes and logs are bind-mounted onto the NVMe RAID (setup-local-disks), so a big root is idle."""
    run = stack_run(stack)
    for template in run.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        (device,) = template.props["blockDeviceMappings"]
        assert 50 <= device["ebs"]["volumeSize"] <= 100
