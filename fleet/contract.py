"""Contract: names, labels, annotations and paths shared by the Pulumi program, the policy pack and the runtime.

The policy pack reads only what a resource carries, so every fact a rule needs (tensor parallel size, drain
timings, environment) is stamped on the resource here. Pure constants: importing this module pulls in nothing.
"""

from __future__ import annotations

__all__ = [
    "AGENT_PORT",
    "ANN_CAPACITY_BUFFER",
    "ANN_ENGINE_KIND",
    "ANN_GPU_MEMORY_UTILIZATION",
    "ANN_MIN_REPLICAS",
    "ANN_SHUTDOWN_TIMEOUT",
    "ANN_TENSOR_PARALLEL",
    "COMPONENT_CONTROL_PLANE",
    "COMPONENT_DEVICE_PLUGIN",
    "COMPONENT_ENGINE",
    "COMPONENT_GATEWAY",
    "CONTROL_PLANE_NAME",
    "ENGINE_PORT",
    "ENGINE_SERVICE_ACCOUNT",
    "GATEWAY_NAME",
    "GPU_RESOURCE",
    "LABEL_COMPONENT",
    "LABEL_ENVIRONMENT",
    "LABEL_GPU_GROUP",
    "LABEL_GPU_MODEL",
    "LABEL_NODE_ROLE",
    "LABEL_POOL",
    "MODEL_CACHE_HOST_PATH",
    "SECRETS_DIR",
    "SPEC_CONFIGMAP",
    "STACKS_DIR",
    "TAG_ENVIRONMENT",
    "TAG_GPU_GROUP",
    "TAG_ZONE",
    "TENANT_KEYS_SECRET",
    "ZONE_TOPOLOGY_KEY",
    "cluster_name",
    "pool_deployment_name",
    "stack_file_path",
]

# Kubernetes labels (on pods, Deployments, Services) and node labels.
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_POOL = "llmfleet.io/pool"
LABEL_ENVIRONMENT = "llmfleet.io/environment"
LABEL_NODE_ROLE = "llmfleet.io/node-role"  # "cpu" or "gpu"
LABEL_GPU_GROUP = "llmfleet.io/gpu-group"
LABEL_GPU_MODEL = "llmfleet.io/gpu-model"
ZONE_TOPOLOGY_KEY = "topology.kubernetes.io/zone"
GPU_RESOURCE = "nvidia.com/gpu"

COMPONENT_ENGINE = "engine"
COMPONENT_GATEWAY = "gateway"
COMPONENT_CONTROL_PLANE = "control-plane"
COMPONENT_DEVICE_PLUGIN = "device-plugin"

# Annotations on each engine Deployment: the pool facts the policy pack checks the pod template against.
ANN_ENGINE_KIND = "llmfleet.io/engine-kind"
ANN_TENSOR_PARALLEL = "llmfleet.io/tensor-parallel-size"
ANN_GPU_MEMORY_UTILIZATION = "llmfleet.io/gpu-memory-utilization"
ANN_SHUTDOWN_TIMEOUT = "llmfleet.io/engine-shutdown-timeout-seconds"
ANN_MIN_REPLICAS = "llmfleet.io/replicas-min"
ANN_CAPACITY_BUFFER = "llmfleet.io/capacity-buffer"

# AWS tags on node groups and launch templates.
TAG_ENVIRONMENT = "llmfleet.io/environment"
TAG_GPU_GROUP = "llmfleet.io/gpu-group"
TAG_ZONE = "llmfleet.io/zone"

# Object names inside the fleet's namespace.
SPEC_CONFIGMAP = "llmfleet-spec"
TENANT_KEYS_SECRET = "llmfleet-tenant-keys"
GATEWAY_NAME = "llmfleet-gateway"
CONTROL_PLANE_NAME = "llmfleet-control-plane"
ENGINE_SERVICE_ACCOUNT = "llmfleet-engine"

AGENT_PORT = 8000
ENGINE_PORT = 8001

# Where containers find the rendered stack file (the ConfigMap) and the tenant key hashes (the Secret).
STACKS_DIR = "/etc/llmfleet/stacks"
SECRETS_DIR = "/etc/llmfleet/secrets"
# AL2023 nodeadm assembles the instance-store NVMe drives into one RAID0 array mounted here.
MODEL_CACHE_HOST_PATH = "/mnt/k8s-disks/0/llmfleet-models"


def cluster_name(environment: str) -> str:
    """The EKS cluster of an environment; the AWS actuator finds the node groups in it."""
    return f"llmfleet-{environment}"


def pool_deployment_name(pool: str) -> str:
    """The engine Deployment of a pool; the control plane's Kubernetes actuator scales it by this name."""
    return f"llmfleet-{pool}"


def stack_file_path(environment: str) -> str:
    """The stack file inside every container: ``--stack`` takes it (the loader accepts a path)."""
    return f"{STACKS_DIR}/Pulumi.{environment}.yaml"
