"""EFA: which P/D pools get Elastic Fabric Adapter devices, how many each replica takes, and what their pods carry.

A disaggregated pool (`fleet.spec.disagg`) moves each remote prompt's KV cache from a prefill replica to a decode
replica over NIXL. On aws that crosses the node's network, and only EFA gives it the bandwidth it needs (NIXL's
LIBFABRIC backend; Dynamo measured ~98 s TTFT over TCP against ~1 s over EFA,
ai-dynamo/dynamo@0c21bf2c:docs/kubernetes/cloud-providers/eks/efa.md). What an EFA pod needs, each from its source:

* devices: the EFA device plugin advertises ``vpc.amazonaws.com/efa`` and a container asks for it in its requests and
  limits; "each EFA device is exclusively allocated to one Pod"
  (awsdocs/amazon-eks-user-guide@43d79bdb:latest/ug/ml/device-management-efa.adoc). How many a node has is its
  instance's EFA count, `EFA_DEVICES`; a replica takes its GPUs' share of them, at least one;
* ``IPC_LOCK`` added to the container's capabilities, as llm-d's AWS overlay does for its vLLM pods
  (llm-d/llm-d@1d0bfe7c:guides/pd-disaggregation/modelserver/gpu/vllm/aws/patch-prefill.yaml). Dynamo runs its EFA
  pods privileged instead ("IPC_LOCK alone is insufficient"), which the pack refuses for engines; and a capability
  added for a non-root user may not reach its effective set (kubernetes/kubernetes#56374): docs/cloud.md, "Prefill/
  decode pools on EFA", says what a first run has to show;
* the libfabric environment Dynamo's EKS guide lists as required on every worker: ``FI_PROVIDER=efa``,
  ``FI_EFA_USE_DEVICE_RDMA=1``, ``FI_EFA_ENABLE_SHM_TRANSFER=0``, ``FI_EFA_ENABLE_SHM=0`` (same Dynamo file, "Required
  EFA environment variables"; its ``LD_LIBRARY_PATH`` entry names the image's own libfabric and is the image's to set);
* on every P/D pod, EFA or not: ``VLLM_NIXL_SIDE_CHANNEL_HOST`` from the downward API ``status.podIP``, as llm-d sets
  it (llm-d/llm-d@04291b76:guides/pd-disaggregation/modelserver/gpu/vllm/base/patch-prefill.yaml). vLLM 0.33 binds
  its NIXL handshake listener to that host and hands it to the decode replica, which connects back to it; the
  default, ``localhost``, reaches neither (vllm@4ba787ec9, the 0.33.0 wheel: vllm/envs.py:1721,
  vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76-80 and 333-334).

The node side (interfaces, security group, placement group, the device plugin) is `infra.efa_cloud`.
"""

from __future__ import annotations

import math
from typing import Any

from fleet.capacity.catalog import INSTANCES
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = [
    "EFA_DEVICES",
    "EFA_ENV",
    "EFA_NODE_LABEL",
    "EFA_RESOURCE",
    "SIDE_CHANNEL_HOST_ENV",
    "efa_node_groups",
    "efa_per_replica",
    "is_pd",
    "with_pd",
]

EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_NODE_LABEL = "llmfleet.io/efa"  # "true" on the nodes of a GPU group launched with EFA interfaces
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"

# EFA devices per node: one EFA per network card. p4d: "p4d.24xlarge ... support up to four EFAs"
# (awsdocs/amazon-ec2-user-guide@0147f878:doc_source/efa.md, "EFA limitations"). p4de: the same 4 as p4d, as issue 39
# states it; the EC2 pages read here name p4d only, so p4de's count is unconfirmed (the device plugin's instance list
# has both, aws/eks-charts@5239609:stable/aws-efa-k8s-device-plugin/values.yaml). p5 and p5e: "support up to 32
# network cards" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html), and a p5.48xlarge
# node reports 32 (ai-dynamo/dynamo@0c21bf2c:docs/kubernetes/cloud-providers/eks/efa.md). An instance type missing
# here gets no EFA: a P/D pool on it moves its KV cache over TCP (`llmfleet validate` warns).
EFA_DEVICES: dict[str, int] = {
    "p4d.24xlarge": 4,
    "p4de.24xlarge": 4,
    "p5.48xlarge": 32,
    "p5e.48xlarge": 32,
}

# Dynamo's "Required EFA environment variables" (ai-dynamo/dynamo@0c21bf2c:docs/kubernetes/cloud-providers/eks/efa.md).
EFA_ENV: dict[str, str] = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_ENABLE_SHM_TRANSFER": "0",
    "FI_EFA_ENABLE_SHM": "0",
}


def is_pd(pool: PoolSpec) -> bool:
    """Whether the pool's engines take part in prefill/decode disaggregation (either role)."""
    return pool.role != "aggregated"


def _devices_per_node(spec: FleetSpec, pool: PoolSpec) -> int:
    if spec.target != "aws" or pool.node_group is None or pool.engine.kind == "sim":
        return 0
    return EFA_DEVICES.get(spec.node_group(pool.node_group).instance_type, 0)


def efa_node_groups(spec: FleetSpec) -> list[str]:
    """The GPU node groups launched with EFA interfaces: those running a P/D pool on an instance with EFA (aws)."""
    return sorted({p.node_group for p in spec.engine_pools if is_pd(p) and _devices_per_node(spec, p) and p.node_group})


def efa_per_replica(spec: FleetSpec, pool: PoolSpec) -> int:
    """EFA devices one replica requests: its GPUs' share of the node's devices, at least one; 0 for a pool that is
    not P/D or runs where there is no EFA. On p4de a TP1 replica takes 1 of 4, so a node holds at most 4 of them."""
    per_node = _devices_per_node(spec, pool) if is_pd(pool) else 0
    if not per_node:
        return 0
    assert pool.node_group is not None
    gpus = INSTANCES[spec.node_group(pool.node_group).instance_type].gpu_count
    return max(1, math.floor(per_node * pool.engine.tensor_parallel_size / gpus))


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def with_pd(spec: FleetSpec, pool: PoolSpec, container: dict[str, Any]) -> dict[str, Any]:
    """``container`` (the agent's, snake_case keys) with what a P/D pool's pod needs: the side channel's host and,
    where the node has EFA, the devices, ``IPC_LOCK`` and libfabric's environment. Unchanged for other pools."""
    if not is_pd(pool):
        return container
    env = [
        *container.get("env", []),
        {"name": SIDE_CHANNEL_HOST_ENV, "value_from": {"field_ref": {"field_path": "status.podIP"}}},
    ]
    devices = efa_per_replica(spec, pool)
    if not devices:
        return {**container, "env": env}
    resources = container.get("resources", {})
    context = dict(container.get("security_context", {}))
    context["capabilities"] = {**context.get("capabilities", {}), "add": ["IPC_LOCK"]}
    return {
        **container,
        "env": [*env, *(_env(k, v) for k, v in EFA_ENV.items())],
        "resources": {
            "requests": {**resources.get("requests", {}), EFA_RESOURCE: str(devices)},
            "limits": {**resources.get("limits", {}), EFA_RESOURCE: str(devices)},
        },
        "security_context": context,
    }
