"""Common: reading resource props the way CrossGuard hands them over (camelCase, possibly proxied).

Props may be plain dicts (offline) or pulumi_policy's unknown-checking proxies (preview), so helpers only
use the Mapping and Sequence protocols. Numbers may arrive as floats (``2.0``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fleet.protocol import contract

__all__ = [
    "DEPLOYMENT",
    "LAUNCH_TEMPLATE",
    "NODE_GROUP",
    "PDB",
    "PRODUCTION_SCHEMA",
    "SERVICE",
    "annotations_of",
    "as_float",
    "as_int",
    "containers",
    "environment",
    "get_path",
    "is_engine",
    "is_gpu_node_group",
    "is_production",
    "labels",
    "mapping",
    "pod_spec",
    "sequence",
]

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"

# Shared config of the rules that apply only to production stacks.
PRODUCTION_SCHEMA: dict[str, dict[str, Any]] = {
    "productionEnvironments": {
        "type": "array",
        "items": {"type": "string"},
        "default": ["prod"],
        "description": "environments (llmfleet.io/environment) held to production rules",
    }
}


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def sequence(value: Any) -> Sequence[Any]:
    return value if isinstance(value, Sequence) and not isinstance(value, str | bytes) else []


def get_path(props: Any, *keys: str) -> Any:
    """``props[k1][k2]...`` or None when any level is missing."""
    value = props
    for key in keys:
        value = mapping(value).get(key)
        if value is None:
            return None
    return value


def as_float(value: Any, default: float | None = None) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def as_int(value: Any, default: int | None = None) -> int | None:
    number = as_float(value)
    return default if number is None else int(number)


def labels(props: Any) -> Mapping[str, Any]:
    return mapping(get_path(props, "metadata", "labels"))


def annotations_of(props: Any) -> Mapping[str, Any]:
    return mapping(get_path(props, "metadata", "annotations"))


def environment(props: Any) -> str:
    """The llmfleet environment a resource belongs to: Kubernetes label or AWS tag."""
    env = labels(props).get(contract.LABEL_ENVIRONMENT) or mapping(props.get("tags")).get(contract.TAG_ENVIRONMENT)
    return str(env or "")


def is_production(props: Any, config: Mapping[str, Any]) -> bool:
    production = config.get("productionEnvironments", PRODUCTION_SCHEMA["productionEnvironments"]["default"])
    return environment(props) in set(production)


def pod_spec(props: Any) -> Mapping[str, Any]:
    return mapping(get_path(props, "spec", "template", "spec"))


def containers(props: Any) -> Iterator[Mapping[str, Any]]:
    for item in sequence(pod_spec(props).get("containers")):
        yield mapping(item)


def is_engine(resource_type: str, props: Any) -> bool:
    """An engine Deployment: labelled with the engine component (on the object or its pod template)."""
    if resource_type != DEPLOYMENT:
        return False
    template_labels = mapping(get_path(props, "spec", "template", "metadata", "labels"))
    component = labels(props).get(contract.LABEL_COMPONENT) or template_labels.get(contract.LABEL_COMPONENT)
    return component == contract.COMPONENT_ENGINE


def is_gpu_node_group(props: Any) -> bool:
    ami = str(props.get("amiType") or "")
    return "NVIDIA" in ami or "GPU" in ami or contract.TAG_GPU_GROUP in mapping(props.get("tags"))
