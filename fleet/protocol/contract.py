"""Contract: names, labels, annotations and paths shared by the Pulumi program, the policy pack and the runtime.

The policy pack reads only what a resource carries, so every fact a rule needs (tensor parallel size, drain
timings, environment) is stamped on the resource here. Pure constants: importing this module pulls in nothing.
"""

from __future__ import annotations

__all__ = [
    "AGENT_PORT",
    "AGENT_PRESTOP_PATH",
    "ANN_ACTUATOR",
    "ANN_CAPACITY_BUFFER",
    "ANN_ENGINE_KIND",
    "ANN_GPU_MEMORY_UTILIZATION",
    "ANN_DRAIN_PROPAGATION",
    "ANN_MIN_REPLICAS",
    "ANN_PROMETHEUS_OPERATOR",
    "ANN_QUOTA_BACKEND",
    "ANN_REDIS_URL_FROM",
    "ANN_REQUEST_TIMEOUT",
    "ANN_TLS",
    "TLS_DIR",
    "ANN_SHUTDOWN_TIMEOUT",
    "ANN_TENSOR_PARALLEL",
    "COMPONENT_CONTROL_PLANE",
    "COMPONENT_DEVICE_PLUGIN",
    "COMPONENT_ENGINE",
    "COMPONENT_GATEWAY",
    "COMPONENT_QUOTA_REDIS",
    "CONTROL_PLANE_NAME",
    "DEVICE_PLUGIN_SOURCE",
    "ENGINE_PORT",
    "KV_EVENTS_PORT",
    "ENGINE_API_KEY_SECRET",
    "ENGINE_API_KEY_SECRET_KEY",
    "ENGINE_SERVICE_ACCOUNT",
    "GATEWAY_NAME",
    "GPU_RESOURCE",
    "IMAGES",
    "IMAGE_DEVICE_PLUGIN",
    "IMAGE_ENGINE",
    "IMAGE_RUNTIME",
    "LABEL_COMPONENT",
    "LABEL_ENVIRONMENT",
    "LABEL_GPU_GROUP",
    "LABEL_GPU_MODEL",
    "LABEL_NODE_ROLE",
    "LABEL_POOL",
    "MODEL_BUCKET_ENV",
    "MODEL_CACHE_HOST_PATH",
    "NLB_MAX_IDLE_TIMEOUT_S",
    "QUOTA_REDIS_NAME",
    "REDIS_URL_ENV",
    "REDIS_URL_KEY",
    "SECRETS_DIR",
    "SPEC_CONFIGMAP",
    "STACKS_DIR",
    "TAG_ENVIRONMENT",
    "TAG_GPU_GROUP",
    "TAG_ZONE",
    "TENANT_KEYS_SECRET",
    "TOKENIZER_CACHE_DIR",
    "TOKENIZER_CACHE_ENV",
    "ZONE_TOPOLOGY_KEY",
    "cluster_name",
    "image_repository_name",
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
COMPONENT_QUOTA_REDIS = "quota-redis"

# Annotations on each engine Deployment: the pool facts the policy pack checks the pod template against.
ANN_ENGINE_KIND = "llmfleet.io/engine-kind"
ANN_TENSOR_PARALLEL = "llmfleet.io/tensor-parallel-size"
ANN_GPU_MEMORY_UTILIZATION = "llmfleet.io/gpu-memory-utilization"
ANN_SHUTDOWN_TIMEOUT = "llmfleet.io/engine-shutdown-timeout-seconds"
ANN_DRAIN_PROPAGATION = "llmfleet.io/drain-propagation-seconds"  # the agent's wait before it stops the engine
ANN_MIN_REPLICAS = "llmfleet.io/replicas-min"
ANN_CAPACITY_BUFFER = "llmfleet.io/capacity-buffer"

# Annotations on the gateway: its request timeout (Service) and where its quotas live (Deployment: "memory" or
# "redis"; a Redis URL from "stack", the stack's redisUrl, or from "secret", the Redis the program provisions).
ANN_REQUEST_TIMEOUT = "llmfleet.io/request-timeout-seconds"
# Where the gateway Service's TLS ends: "load-balancer" (the NLB, an ACM certificate), "gateway" (the process,
# from a TLS Secret) or "none" (plain HTTP).
ANN_TLS = "llmfleet.io/tls"
TLS_DIR = "/etc/llmfleet/tls"  # the gateway's TLS Secret (tls.crt, tls.key)
ANN_QUOTA_BACKEND = "llmfleet.io/quota-backend"
ANN_REDIS_URL_FROM = "llmfleet.io/redis-url-from"
# On PrometheusRule and PodMonitor objects: "installed" (the stack installs the operator's CRDs) or "existing".
ANN_PROMETHEUS_OPERATOR = "llmfleet.io/prometheus-operator"

# Annotation on the control plane's Deployment: the actuator carrying out its decisions (``aws (dry run)`` when
# it only logs them).
ANN_ACTUATOR = "llmfleet.io/actuator"

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
QUOTA_REDIS_NAME = "llmfleet-quota-redis"  # the in-cluster Redis (Deployment, Service) and the URL Secret
REDIS_URL_KEY = "url"  # the URL Secret's key
REDIS_URL_ENV = "LLMFLEET_REDIS_URL"  # the gateway reads the quota Redis URL from this variable when set
ENGINE_API_KEY_SECRET = "llmfleet-engine-api-key"  # the engines' API key; engine and gateway pods read it
ENGINE_API_KEY_SECRET_KEY = "api-key"  # that Secret's key

# An NLB listener's idle timeout (tcp.idle_timeout.seconds) is at most this many seconds.
NLB_MAX_IDLE_TIMEOUT_S = 6000

# Container images, each a repository under the stack's registry (on aws, ECR repositories the stack owns).
IMAGE_RUNTIME = "runtime"  # gateway, control plane, agent with the engine simulator (images/runtime.Dockerfile)
IMAGE_ENGINE = "engine"  # vLLM plus the agent (images/engine.Dockerfile)
IMAGE_DEVICE_PLUGIN = "nvidia-device-plugin"  # NVIDIA's release, mirrored with its digest unchanged
IMAGES = (IMAGE_RUNTIME, IMAGE_ENGINE, IMAGE_DEVICE_PLUGIN)
# The NVIDIA device plugin release the aws target runs, where NVIDIA publishes it (`images/push.sh` mirrors it).
# The digest is the multi-platform index NVIDIA's own operator pins for this tag (NVIDIA/gpu-operator v26.3.3,
# bundle/manifests/gpu-operator-certified.clusterserviceversion.yaml relatedImages).
DEVICE_PLUGIN_SOURCE = (
    "nvcr.io/nvidia/k8s-device-plugin:v0.19.3@sha256:25cc340fe6fd53c101e16fc452f503e7a92c219c64a80ed5381784b522dbbf77"
)

AGENT_PORT = 8000
AGENT_PRESTOP_PATH = "/prestop"  # the agent's preStop hook: starts the drain when the pod starts terminating
ENGINE_PORT = 8001
KV_EVENTS_PORT = 5557  # the engine's KV-cache event PUB socket (engine.kvEvents): vLLM's default endpoint port

# Where containers find the rendered stack file (the ConfigMap) and the tenant key hashes (the Secret).
STACKS_DIR = "/etc/llmfleet/stacks"
SECRETS_DIR = "/etc/llmfleet/secrets"
# AL2023 nodeadm assembles the instance-store NVMe drives into one RAID0 array mounted here.
MODEL_CACHE_HOST_PATH = "/mnt/k8s-disks/0/llmfleet-models"
# The stack's model bucket, in the environment of the pods that read it (engines: the model; gateways: tokenizers).
MODEL_BUCKET_ENV = "LLMFLEET_MODEL_BUCKET"
# Where a gateway caches the tokenizers it fetches from the model bucket (an emptyDir in the gateway pod).
TOKENIZER_CACHE_ENV = "LLMFLEET_TOKENIZER_CACHE"
TOKENIZER_CACHE_DIR = "/var/cache/llmfleet/tokenizers"


def cluster_name(environment: str) -> str:
    """The EKS cluster of an environment; the AWS actuator finds the node groups in it."""
    return f"llmfleet-{environment}"


def image_repository_name(environment: str, image: str) -> str:
    """An environment's ECR repository of one of `IMAGES`: ``llmfleet-<env>/<image>``."""
    return f"llmfleet-{environment}/{image}"


def pool_deployment_name(pool: str) -> str:
    """The engine Deployment of a pool; the control plane's Kubernetes actuator scales it by this name."""
    return f"llmfleet-{pool}"


def stack_file_path(environment: str) -> str:
    """The stack file inside every container: ``--stack`` takes it (the loader accepts a path)."""
    return f"{STACKS_DIR}/Pulumi.{environment}.yaml"
