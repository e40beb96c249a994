"""P/D pools: the prefill/decode pools of an aws stack, read back from its graph for the EFA rules (`policies.efa`).

Which pools run disaggregated comes from the stack file the stack deploys (its ``llmfleet-spec`` ConfigMap, the
spec as the containers load it, `infra.k8s_base.render_stack_file`), not from marks on the pool's own resources: a
program change that dropped a mark would otherwise hide the pool from the rules that check it. Each P/D pool
``<pool>`` runs two engine Deployments, its own (decode) and its prefill role pool's ``<pool>-prefill``
(`fleet.spec.pool.PoolSpec.prefill_pool`), on the GPU node group ``nodeGroup`` names; that group's launch
templates carry its name in the ``llmfleet.io/gpu-group`` tag (`infra.nodegroups`). Only an aws stack (an EKS
cluster in the graph) has nodes the stack launches, so only there do the EFA rules apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import yaml
from pulumi_policy import PolicyResource

from fleet.protocol import contract
from fleet.spec.disagg import PREFILL_SUFFIX
from fleet.spec.loader import NAMESPACE
from policies.common import LAUNCH_TEMPLATE, get_path, is_engine, mapping, sequence

__all__ = ["EKS_CLUSTER", "PdPool", "launch_templates_of", "pd_pools"]

EKS_CLUSTER = "aws:eks/cluster:Cluster"


@dataclass(frozen=True)
class PdPool:
    """A disaggregated pool as deployed: its name, its GPU node group, and the engine Deployments of its roles."""

    name: str
    node_group: str | None
    deployments: dict[str, PolicyResource | None]  # object name (decode's, then prefill's) -> its Deployment

    @property
    def anchor(self) -> str | None:
        """The URN violations about the pool point at: its first Deployment in the graph."""
        found = [d for d in self.deployments.values() if d is not None]
        return found[0].urn if found else None


def _stack_documents(resources: Iterable[PolicyResource]) -> list[object]:
    documents: list[object] = []
    for resource in resources:
        if get_path(resource.props, "metadata", "name") != contract.SPEC_CONFIGMAP:
            continue
        for text in mapping(resource.props.get("data")).values():
            try:
                documents.append(yaml.safe_load(str(text)))
            except yaml.YAMLError:
                continue
    return documents


def pd_pools(resources: Sequence[PolicyResource]) -> list[PdPool]:
    """The P/D pools of an aws stack (none elsewhere), each with its engine Deployments by object name (None: the
    graph has no such Deployment)."""
    if not any(r.resource_type == EKS_CLUSTER for r in resources):
        return []
    engines = {str(get_path(r.props, "metadata", "name")): r for r in resources if is_engine(r.resource_type, r.props)}
    pools: dict[str, PdPool] = {}
    for document in _stack_documents(resources):
        for item in sequence(get_path(document, "config", f"{NAMESPACE}:pools")):
            pool = mapping(item)
            if pool.get("disaggregation") is None or not pool.get("name"):
                continue
            name = str(pool["name"])
            objects = [contract.pool_deployment_name(name), contract.pool_deployment_name(name + PREFILL_SUFFIX)]
            group = pool.get("nodeGroup")
            pools[name] = PdPool(name, str(group) if group else None, {o: engines.get(o) for o in objects})
    return [pools[name] for name in sorted(pools)]


def launch_templates_of(resources: Iterable[PolicyResource], group: str) -> list[PolicyResource]:
    """The launch templates of GPU node group ``group`` (one per zone)."""
    return [
        r
        for r in resources
        if r.resource_type == LAUNCH_TEMPLATE and mapping(r.props.get("tags")).get(contract.TAG_GPU_GROUP) == group
    ]
