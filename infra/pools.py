"""Engine pools: per pool a Deployment of agent-supervised engines, a headless Service and a PDB.

Each pod runs ``llmfleet agent --stack <file> --pool <pool> --port 8000``; the agent launches vLLM (or the simulator)
from the pool's spec (with ``engine.kvEvents``, its KV-cache events on port 5557). Draining is loss-free:

* one drain budget from the stack, waited once: ``preStop`` is an ``httpGet`` of the agent's ``/prestop``, which
  starts the drain at once (readiness falls, the control plane and gateways stop routing); the agent keeps the
  engine serving for ``drain.propagationSeconds`` while they notice, then stops it with vLLM's
  ``--shutdown-timeout`` = grace - propagation - 5 s; the kubelet's SIGTERM finds the drain already running;
* ``terminationGracePeriodSeconds`` = ``drain.graceSeconds`` = propagation + shutdown timeout + 5 s margin; GPUs
  requested = tensor parallel size; ``/dev/shm`` is a memory-backed emptyDir (NCCL, the tokenizer pool);
* the model cache is the node's NVMe RAID (hostPath) so a restarted replica reloads from local disk: the agent
  fetches the pool's model from the stack's bucket (``LLMFLEET_MODEL_BUCKET``) into ``/models/store``
  (``LLMFLEET_MODEL_CACHE``), Hub downloads go to ``/models/hf`` (``HF_HOME``); replicas on one node share it.
  The node's bootstrap creates the folder owned by the images' user (`infra.node_userdata.node_user_data`), so no
  container runs as root; the hostPath is of type ``Directory``: a node without it fails the pod visibly instead
  of the kubelet creating a root-owned folder the agent cannot write;
* the engines' API key (``$LLMFLEET_ENGINE_API_KEY``) comes from its Secret, mounted as a file that the
  container's command exports (`infra.k8s_base.llmfleet_command`; no Secret in ``env``); the agent gives it to
  vLLM, so reaching the engine's port without it gets a 401;
* pod security: the images' user (uid/gid 10001), non-root, no privilege escalation, every capability dropped,
  the runtime's seccomp profile, a read-only root file system. The writable places are volumes: the node cache
  (``/models``: fetched weights, the Hugging Face cache, and vLLM's, Triton's and Inductor's compile caches under
  ``/models/compile``, `COMPILE_CACHE_ENV`, so a restart does not recompile), ``/tmp`` (Python's tempfile, vLLM's
  IPC sockets), ``/dev/shm`` and ``$HOME`` (``/home/llmfleet``: what libraries cache under ``~/.cache`` and
  ``~/.config``: FlashInfer and other JIT kernels, outlines, numba, vLLM's usage stats);
* the pod keeps its API token: the agent checks drain callers with TokenReview (``create`` is all its account may do);
* replicas spread evenly over zones (``topology.kubernetes.io/zone``) so a zone outage leaves capacity;
* ``spec.replicas`` belongs to the control plane after creation (Pulumi ignores later changes to it);
* a first replica on a new node pulls a 25-29 GB vLLM image before the pool's ``coldStartSeconds`` even starts
  (vllm-project/vllm#17163), longer than Pulumi's 10-minute await and Kubernetes' 600 s progress deadline: the
  Deployment's ``progressDeadlineSeconds`` is `first_ready_seconds` (`ENGINE_IMAGE_PULL_S` plus the cold start)
  and Pulumi awaits a little longer (`await_timeouts`: its custom timeouts, and ``pulumi.com/timeoutSeconds`` for
  the policy pack to read); an update rolls one replica at a time, so its await grows with ``replicas.max``;
* the pod template carries checksums of what the agent reads at start (its pool's part of the stack file, the
  engines' API key), so `pulumi up` rolls the pool when they change and not on an unrelated tenant edit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.capacity.catalog import INSTANCES
from fleet.protocol import contract
from fleet.protocol.marks import (
    ANN_CHECKSUM_ENGINE_KEY,
    ANN_CHECKSUM_POOL,
    ANN_FIRST_READY,
    ANN_PULUMI_TIMEOUT,
    ANN_RESUME_STREAMS,
    DEFAULT_AWAIT_S,
)
from fleet.spec.stack import FleetSpec, PoolSpec
from infra.control_auth import auth_args, token_env, token_mount, token_volume
from infra.efa import with_pd
from infra.images import ImageRefs
from infra.k8s_base import (
    ENGINE_API_KEY_FILE,
    IMAGE_UID,
    container_security_context,
    home_volume,
    http_probe,
    llmfleet_command,
    model_bucket_env,
    pod_security_context,
    secret_checksum,
    sha256_text,
    spec_volumes,
)
from infra.k8s_shapes import shaped

__all__ = [
    "ENGINE_IMAGE_PULL_S",
    "IMAGE_UID",
    "COMPILE_CACHE_ENV",
    "MODEL_CACHE_MOUNT",
    "MODEL_STORE_DIR",
    "EnginePool",
    "EnginePoolArgs",
    "await_timeouts",
    "engine_deployment_spec",
    "engine_labels",
    "engine_pod_spec",
    "first_ready_seconds",
    "pool_checksum",
    "progress_deadline_seconds",
]

MODEL_CACHE_MOUNT = "/models"  # the node cache volume inside the engine container
MODEL_STORE_DIR = f"{MODEL_CACHE_MOUNT}/store"  # models fetched from the model store (agent.model_store)
HF_HOME_DIR = f"{MODEL_CACHE_MOUNT}/hf"  # the Hugging Face cache, for pools that load from the Hub
# Allowance for pulling and unpacking the engine image on a node that has never run it: 25-29 GB
# (vllm-project/vllm#17163) through the NAT. Generous on purpose: a timed-out await fails the `up`, a long one
# only waits.
ENGINE_IMAGE_PULL_S = 1800


def first_ready_seconds(pool: PoolSpec) -> int:
    """How long a pool's first replica may take to turn Ready on a new node: the engine image's pull (pools
    running the vLLM image) plus the pool's ``coldStartSeconds`` (weights, load, compile)."""
    pull = ENGINE_IMAGE_PULL_S if pool.runs_engine_image else 0
    return pull + math.ceil(pool.cold_start_seconds)


def progress_deadline_seconds(pool: PoolSpec) -> int:
    """The Deployment's ``progressDeadlineSeconds``: `first_ready_seconds`, never below Kubernetes' default 600 s
    (a simulated pool's 30 s cold start would otherwise stall its rollout on a slow image pull)."""
    return max(DEFAULT_AWAIT_S, first_ready_seconds(pool))


def await_timeouts(pool: PoolSpec) -> tuple[int, int]:
    """(create, update) seconds Pulumi awaits the Deployment: a create starts ``replicas.min`` at once; an update
    replaces replicas one at a time (maxSurge 1), each a cold start on a warm node. Both outlast the progress
    deadline, so a stuck rollout is reported by Kubernetes (ProgressDeadlineExceeded), not by a Pulumi timeout."""
    create = progress_deadline_seconds(pool) + 300
    update = create + max(0, pool.replicas.max - 1) * (math.ceil(pool.cold_start_seconds) + 60)
    return create, update


def pool_checksum(spec: FleetSpec, pool: PoolSpec) -> str:
    """sha256 of what a pool's agent reads from the stack file: its pool, the control plane, the target, region and
    model store. Tenants, quotas and the gateway's settings are not in it: editing them rolls no engine."""
    read = {
        "pool": pool.model_dump(mode="json", by_alias=True),
        "controlPlane": spec.control_plane.model_dump(mode="json", by_alias=True),
        "target": spec.target,
        "region": spec.region,
        "modelStore": spec.model_store.model_dump(mode="json", by_alias=True),
    }
    return sha256_text(json.dumps(read, sort_keys=True))


# vLLM's, Triton's and Inductor's compile caches default under $HOME/.cache and /tmp, which a restart loses; on
# the node cache a restarted replica reuses its compiled graphs and kernels (`infra.node_userdata` makes them).
COMPILE_CACHE_ENV = {
    "VLLM_CACHE_ROOT": f"{MODEL_CACHE_MOUNT}/compile/vllm",
    "TRITON_CACHE_DIR": f"{MODEL_CACHE_MOUNT}/compile/triton",
    "TORCHINDUCTOR_CACHE_DIR": f"{MODEL_CACHE_MOUNT}/compile/inductor",
}


def engine_labels(spec: FleetSpec, pool: PoolSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "llmfleet",
        contract.LABEL_COMPONENT: contract.COMPONENT_ENGINE,
        contract.LABEL_POOL: pool.name,
        contract.LABEL_ENVIRONMENT: spec.environment,
    }


def _resources(spec: FleetSpec, pool: PoolSpec) -> dict[str, Any]:
    tp = pool.engine.tensor_parallel_size
    if pool.engine.kind == "sim" or pool.node_group is None:
        return {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    instance = INSTANCES[spec.node_group(pool.node_group).instance_type]
    # A replica's share of the node (its GPUs' fraction), leaving ~20% for the kubelet, daemons and the agent.
    cpu = max(1, math.floor(instance.vcpus * tp / instance.gpu_count * 0.8))
    memory = max(8, math.floor(instance.memory_gib * tp / instance.gpu_count * 0.8))
    gpus = str(tp)
    return {
        "requests": {"cpu": str(cpu), "memory": f"{memory}Gi", contract.GPU_RESOURCE: gpus},
        "limits": {"memory": f"{memory}Gi", contract.GPU_RESOURCE: gpus},
    }


def _engine_volumes(spec: FleetSpec, pool: PoolSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): the stack file and key hashes, the engine key file, ``/dev/shm``, the model cache,
    ``/tmp``, ``$HOME``, the control token. Every writable place the engine has is one of these (read-only root)."""
    gpu_pool = pool.engine.kind != "sim" and pool.node_group is not None
    base_volumes, mounts = spec_volumes(spec)
    shm_gib = min(32, 8 * pool.engine.tensor_parallel_size) if gpu_pool else 1
    home, home_mount, _ = home_volume("8Gi" if gpu_pool else "1Gi")
    volumes = [
        *base_volumes,
        ENGINE_API_KEY_FILE.volume_spec(),
        {"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": f"{shm_gib}Gi"}},
        {"name": "model-cache", **_model_cache(spec)},
        {"name": "tmp", "empty_dir": {"size_limit": "8Gi"}},
        home,
        token_volume(),
    ]
    writable = [("dshm", "/dev/shm"), ("model-cache", MODEL_CACHE_MOUNT), ("tmp", "/tmp")]
    mounts += [{"name": v, "mount_path": path} for v, path in writable]
    return volumes, [*mounts, home_mount, ENGINE_API_KEY_FILE.mount(), token_mount()]


def _engine_env(model_bucket: pulumi.Input[str] | None) -> list[dict[str, Any]]:
    """The agent's environment: the pod's identity and addresses, its token's path, ``$HOME``, the caches (the engines'
    API key comes from its file, `llmfleet_command`)."""
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "value_from": {"field_ref": {"field_path": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "value_from": {"field_ref": {"field_path": "metadata.namespace"}}},
        {"name": "POD_IP", "value_from": {"field_ref": {"field_path": "status.podIP"}}},
        {"name": "HOST_IP", "value_from": {"field_ref": {"field_path": "status.hostIP"}}},
        *token_env(),
        {"name": "NODE_NAME", "value_from": {"field_ref": {"field_path": "spec.nodeName"}}},
        home_volume("")[2],
        {"name": "HF_HOME", "value": HF_HOME_DIR},
        {"name": "LLMFLEET_MODEL_CACHE", "value": MODEL_STORE_DIR},
        *({"name": k, "value": v} for k, v in COMPILE_CACHE_ENV.items()),
    ]
    return env + model_bucket_env(model_bucket)


def _agent_args(spec: FleetSpec, pool: PoolSpec) -> list[str]:
    return [
        "agent", "--stack", contract.stack_file_path(spec.environment), "--pool", pool.name,
        "--port", str(contract.AGENT_PORT), "--replica", "$(POD_NAME)",
        # Probes and the gateway reach the pod on its IP; the agent advertises the engine there.
        "--host", "0.0.0.0", "--engine-host", "0.0.0.0", "--engine-port", str(contract.ENGINE_PORT),
        *(["--kv-events-port", str(contract.KV_EVENTS_PORT)] if pool.engine.kv_events else []),
        "--advertise-host", "$(POD_IP)",
        *auth_args(),
        # The kubelet calls the preStop hook from the node's address, without a credential.
        "--prestop-from", "$(HOST_IP)",
    ]  # fmt: skip


def _agent_container(
    spec: FleetSpec, pool: PoolSpec, image: pulumi.Input[str], model_bucket: pulumi.Input[str] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the agent's container, the pod's volumes): the agent runs the engine in the same container."""
    volumes, mounts = _engine_volumes(spec, pool)
    container = {
        "name": "agent",
        "image": image,
        "image_pull_policy": spec.images.pull_policy,
        "command": llmfleet_command([ENGINE_API_KEY_FILE]),  # the agent hands the key to vLLM as $VLLM_API_KEY
        "args": _agent_args(spec, pool),
        "ports": [
            {"name": "agent", "container_port": contract.AGENT_PORT},
            {"name": "engine", "container_port": contract.ENGINE_PORT},
            *([{"name": "kv-events", "container_port": contract.KV_EVENTS_PORT}] if pool.engine.kv_events else []),
        ],
        "env": _engine_env(model_bucket),
        "resources": _resources(spec, pool),
        # Startup: the agent itself answers /healthz within seconds; readiness (/readyz) covers the engine's load.
        "startup_probe": {**http_probe("/healthz", contract.AGENT_PORT, 5, 24)},
        "readiness_probe": http_probe("/readyz", contract.AGENT_PORT, 5, 2),
        "liveness_probe": http_probe("/healthz", contract.AGENT_PORT, 10, 3),
        "lifecycle": {"pre_stop": {"http_get": {"path": contract.AGENT_PRESTOP_PATH, "port": "agent"}}},
        "volume_mounts": mounts,
        "security_context": container_security_context(read_only_root=True),
    }
    return with_pd(spec, pool, container), volumes  # P/D pools: the side channel's host, EFA (`infra.efa`)


def engine_pod_spec(
    spec: FleetSpec, pool: PoolSpec, image: pulumi.Input[str], model_bucket: pulumi.Input[str] | None
) -> dict[str, Any]:
    """One pool's pod spec (snake_case keys, as pulumi_kubernetes inputs): the agent's container, spread over
    zones, on its GPU nodes (selected and tolerated) when it has any."""
    container, volumes = _agent_container(spec, pool, image, model_bucket)
    pod: dict[str, Any] = {
        "service_account_name": contract.ENGINE_SERVICE_ACCOUNT,
        "security_context": pod_security_context(),
        # The agent checks drain callers with TokenReview, an API call, as its own account: the one pod of the fleet
        # besides the control plane's that mounts an API token (the account mounts none by default).
        "automount_service_account_token": True,
        "termination_grace_period_seconds": pool.drain.grace_seconds,
        "containers": [container],
        "volumes": volumes,
        "topology_spread_constraints": [
            {
                "max_skew": 1,
                "topology_key": contract.ZONE_TOPOLOGY_KEY,
                # On AWS every zone has its own GPU node group, so a hard spread is always satisfiable.
                "when_unsatisfiable": "DoNotSchedule" if spec.target == "aws" else "ScheduleAnyway",
                "label_selector": {"match_labels": engine_labels(spec, pool)},
            }
        ],
    }
    if pool.engine.kind != "sim" and pool.node_group is not None:
        pod["node_selector"] = {f"pool.llmfleet.io/{pool.name}": "true"}
        pod["tolerations"] = [{"key": contract.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def engine_deployment_spec(
    spec: FleetSpec,
    pool: PoolSpec,
    image: pulumi.Input[str],
    model_bucket: pulumi.Input[str] | None,
    engine_api_key: pulumi.Input[str] | None = None,
) -> dict[str, Any]:
    """The Deployment ``spec`` of one pool (snake_case keys, as pulumi_kubernetes inputs), running ``image``;
    ``engine_api_key`` (secret) is checksummed on the pod template."""
    labels = engine_labels(spec, pool)
    template_annotations: dict[str, pulumi.Input[str]] = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        ANN_CHECKSUM_POOL: pool_checksum(spec, pool),
    }
    if engine_api_key is not None:
        template_annotations[ANN_CHECKSUM_ENGINE_KEY] = secret_checksum(engine_api_key)
    return {
        "replicas": pool.replicas.min,
        "selector": {"match_labels": labels},
        "strategy": {"type": "RollingUpdate", "rolling_update": {"max_surge": 1, "max_unavailable": 0}},
        "progress_deadline_seconds": progress_deadline_seconds(pool),
        "template": {
            "metadata": {"labels": labels, "annotations": template_annotations},
            "spec": engine_pod_spec(spec, pool, image, model_bucket),
        },
    }


def _model_cache(spec: FleetSpec) -> dict[str, Any]:
    if spec.target == "aws":
        # Created by the node's bootstrap, owned by the images' user (see `infra.nodegroups.node_user_data`).
        return {"host_path": {"path": contract.MODEL_CACHE_HOST_PATH, "type": "Directory"}}
    return {"empty_dir": {"size_limit": "64Gi"}}


def engine_annotations(pool: PoolSpec) -> dict[str, str]:
    """The pool facts the policy pack checks the pod template against."""
    return {
        contract.ANN_ENGINE_KIND: pool.engine.kind,
        contract.ANN_TENSOR_PARALLEL: str(pool.engine.tensor_parallel_size),
        contract.ANN_GPU_MEMORY_UTILIZATION: f"{pool.engine.gpu_memory_utilization:g}",
        contract.ANN_SHUTDOWN_TIMEOUT: str(pool.drain.engine_shutdown_timeout),
        contract.ANN_DRAIN_PROPAGATION: f"{pool.drain.propagation_seconds:g}",
        contract.ANN_MIN_REPLICAS: str(pool.replicas.min),
        contract.ANN_CAPACITY_BUFFER: f"{pool.workload.capacity_buffer:g}",
        ANN_RESUME_STREAMS: "true" if pool.resume_streams else "false",
        ANN_FIRST_READY: str(first_ready_seconds(pool)),
        # pulumi-kubernetes' await timeout when no customTimeouts apply; the policy pack reads it.
        ANN_PULUMI_TIMEOUT: str(await_timeouts(pool)[0]),
    }


@dataclass(frozen=True)
class EnginePoolArgs:
    spec: FleetSpec
    pool: PoolSpec
    images: ImageRefs
    model_bucket: pulumi.Input[str] | None = None
    engine_api_key: pulumi.Input[str] | None = None  # secret: checksummed on the pod template
    service_after: Sequence[pulumi.Resource] = field(default_factory=list)  # the LB controller (its webhook)


class EnginePool(pulumi.ComponentResource):
    """One pool's Deployment, headless Service (stable pod DNS for discovery) and PodDisruptionBudget."""

    deployment_name: str

    def __init__(self, name: str, args: EnginePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:EnginePool", name, None, opts)
        spec, pool = args.spec, args.pool
        labels = engine_labels(spec, pool)
        self.deployment_name = contract.pool_deployment_name(pool.name)
        meta: k8s.meta.v1.ObjectMetaArgsDict = {"namespace": spec.cluster.namespace, "labels": labels}
        create_s, update_s = await_timeouts(pool)
        k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata={**meta, "name": self.deployment_name, "annotations": engine_annotations(pool)},
            spec=shaped(
                engine_deployment_spec(spec, pool, args.images.for_pool(pool), args.model_bucket, args.engine_api_key),
                k8s.apps.v1.DeploymentSpecArgsDict,
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                ignore_changes=["spec.replicas"],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{create_s}s", update=f"{update_s}s"),
            ),
        )
        k8s.core.v1.Service(
            f"{name}-service",
            metadata={**meta, "name": self.deployment_name},
            spec=shaped(
                {
                    "cluster_ip": "None",
                    "selector": labels,
                    "ports": [
                        {"name": "agent", "port": contract.AGENT_PORT, "target_port": "agent"},
                        {"name": "engine", "port": contract.ENGINE_PORT, "target_port": "engine"},
                    ],
                },
                k8s.core.v1.ServiceSpecArgsDict,
            ),
            # The LB controller's webhook sees every Service created: none is created before the controller runs.
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.service_after)),
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata={**meta, "name": self.deployment_name},
            spec=shaped(
                {"max_unavailable": pool.restart_window.max_unavailable, "selector": {"match_labels": labels}},
                k8s.policy.v1.PodDisruptionBudgetSpecArgsDict,
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"deployment": self.deployment_name})
