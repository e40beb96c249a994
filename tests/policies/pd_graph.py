"""P/D graph: the mocked program's graph of an aws stack with a prefill/decode pool, and that graph missing each
EFA part the program provides (`infra.efa`, `infra.efa_cloud`), as the program change that drops it would."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from infra.offline import OfflineRun, RecordedResource
from infra.stack_run import offline_run
from tests.support.stacks import stack_document

Graph = list[RecordedResource]

# The aws preset (prod-like, one vLLM pool on p4de) with its pool disaggregated over EFA.
PD_OVERRIDES: dict[str, Any] = {
    "autoscaling.actuator": "aws",
    "pools.0.disaggregation": {"prefill": {"replicas": {"min": 2, "max": 4}}, "backends": ["LIBFABRIC"]},
}

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
RELEASE = "kubernetes:helm.sh/v3:Release"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
EFA = "vpc.amazonaws.com/efa"


@functools.cache
def pd_run() -> OfflineRun:
    return offline_run(stack_document("aws", **PD_OVERRIDES), "prod")


def pd_graph() -> Graph:
    return list(pd_run().resources)


def edit(type_token: str, change: Callable[[dict[str, Any]], Any], when: Callable[[RecordedResource], bool]) -> Any:
    """A graph edit: ``change`` the props (a copy) of each resource of ``type_token`` that ``when`` selects."""

    def apply(graph: Graph) -> Graph:
        out = []
        for resource in graph:
            if resource.type == type_token and when(resource):
                props = copy.deepcopy(resource.props)
                change(props)
                resource = dataclasses.replace(resource, props=props)
            out.append(resource)
        return out

    return apply


def drop(type_token: str, when: Callable[[RecordedResource], bool] = lambda r: True) -> Any:
    return lambda graph: [r for r in graph if not (r.type == type_token and when(r))]


def _efa_chart(resource: RecordedResource) -> bool:
    return resource.props.get("chart") == "aws-efa-k8s-device-plugin"


def _no_efa(props: dict[str, Any]) -> None:
    for container in props["spec"]["template"]["spec"]["containers"]:
        for part in ("requests", "limits"):
            container["resources"][part].pop(EFA, None)


def _any(resource: RecordedResource) -> bool:
    del resource  # Unused: every resource of the type.
    return True


# policy -> (the program change, that change on the P/D graph)
MISSING: dict[str, tuple[str, Callable[[Graph], Graph]]] = {
    "efa-device-plugin-installed": (
        "infra/program.py stops installing the EFA device plugin",
        drop(RELEASE, _efa_chart),
    ),
    "efa-security-group-allows-itself": (
        "infra/efa_cloud.py drops the EFA security group's rule admitting the group itself",
        drop(INGRESS_RULE),
    ),
    "efa-requested-by-pd-pods": (
        "infra/efa.py stops adding vpc.amazonaws.com/efa to the P/D pods' requests and limits",
        edit(DEPLOYMENT, _no_efa, lambda r: r.name.startswith("pool-")),
    ),
    "efa-cluster-placement": (
        "infra/nodegroups.py stops naming the cluster placement group in the EFA launch templates",
        edit(LAUNCH_TEMPLATE, lambda p: p.pop("placement", None), _any),
    ),
}


def _drop_tolerations(props: dict[str, Any]) -> None:
    props["values"]["tolerations"] = []


# Further ways to lose a part: name -> (policy it trips, the edit).
ALSO_MISSING: dict[str, tuple[str, Callable[[Graph], Graph]]] = {
    "the EFA chart tolerates no GPU taint": (
        "efa-device-plugin-installed",
        edit(RELEASE, _drop_tolerations, _efa_chart),
    ),
    "no egress to the group itself": ("efa-security-group-allows-itself", drop(EGRESS_RULE)),
    "launch templates without EFA interfaces": (
        "efa-security-group-allows-itself",
        edit(LAUNCH_TEMPLATE, lambda p: p.pop("networkInterfaces", None), _any),
    ),
    "no prefill Deployment (pools, not engine pools)": (
        "efa-requested-by-pd-pods",
        drop(DEPLOYMENT, lambda r: r.name == "pool-qwen-7b-prefill-deployment"),
    ),
    "a placement group that is not a cluster": (
        "efa-cluster-placement",
        edit("aws:ec2/placementGroup:PlacementGroup", lambda p: p.update(strategy="spread"), _any),
    ),
}
