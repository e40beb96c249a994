"""Kubernetes base: the fleet's namespace, the rendered stack file (ConfigMap), tenant key hashes (Secret), the
engines' API key (Secret).

Every container reads the same stack file the stack was deployed from, so what runs is what was declared:
`render_stack_file` writes the FleetSpec back as a stack document, with the control plane's in-cluster URL
filled in. Tenants' plain keys never reach the cluster: the Secret holds only their sha256 hashes. The engines'
API key does (engines must check it): its Secret reaches containers only as a file (`ENGINE_API_KEY_FILE`), which
`infra.pools` and `infra.gateway_tier` mount and the control plane does not.

Secrets are files, never ``env`` entries (``secretKeyRef``): a variable taken from a Secret shows in ``kubectl
describe``-style tooling and crash reports, is inherited by every child process and never follows a rotation.
Processes that read a secret only from a variable (the engine key, the quota Redis URL) are started by
`llmfleet_command`: ``/bin/sh`` exports the variable from its mounted file and ``exec``s ``llmfleet``, so the
rendered objects hold a path, no value and no Secret reference in ``env``.

On aws the namespace is labelled for the AWS Load Balancer Controller's pod readiness gates: a gateway pod is
Ready only once the NLB reports it healthy, so a rollout never leaves the load balancer with no healthy target.
Its pod webhook fails open (``podMutatorWebhookConfig.failurePolicy: Ignore``, `infra.lb_controller`), so engine
and control-plane pods start while the controller is down.

Pods read these objects at start; `sha256_text` and `secret_checksum` make the checksums their templates carry.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from fleet.protocol import contract
from fleet.protocol.control_auth import ENGINE_API_KEY_ENV
from fleet.protocol.marks import READINESS_GATE_LABEL
from fleet.spec.loader import NAMESPACE
from fleet.spec.stack import FleetSpec

__all__ = [
    "ENGINE_API_KEY_FILE",
    "HOME_DIR",
    "IMAGE_UID",
    "FleetBase",
    "FleetBaseArgs",
    "container_security_context",
    "control_plane_url",
    "SecretFile",
    "home_volume",
    "llmfleet_command",
    "http_probe",
    "irsa_annotations",
    "model_bucket_env",
    "pod_security_context",
    "pod_security_labels",
    "namespace_labels",
    "render_stack_file",
    "secret_checksum",
    "sha256_text",
    "spec_volumes",
    "uses_host_path",
]

IMAGE_UID = 10001  # the USER (uid and gid) of images/runtime.Dockerfile and images/engine.Dockerfile


def uses_host_path(spec: FleetSpec) -> bool:
    """Whether a fleet pod mounts a hostPath: the engines' node model cache on aws."""
    return spec.target == "aws"


def pod_security_labels(spec: FleetSpec) -> dict[str, str]:
    """Pod Security Admission labels of the fleet namespace.

    ``restricted`` is enforced where every fleet pod meets it. On aws the engines mount the node's NVMe model
    cache as a hostPath, which both ``restricted`` and ``baseline`` forbid, so there the namespace enforces
    ``privileged`` (admits the hostPath) while ``warn`` and ``audit`` stay ``restricted``: every other deviation
    shows in ``kubectl`` warnings and the audit log, and the policy pack's engines-run-as-non-root holds the
    engines to non-root, no privilege escalation and no root init containers.
    """
    enforce = "privileged" if uses_host_path(spec) else "restricted"
    labels = {"pod-security.kubernetes.io/enforce": enforce}
    for mode in ("enforce", "warn", "audit"):
        labels.setdefault(f"pod-security.kubernetes.io/{mode}", "restricted")
        labels[f"pod-security.kubernetes.io/{mode}-version"] = "latest"
    return labels


def namespace_labels(spec: FleetSpec) -> dict[str, str]:
    """The fleet namespace's labels: environment, Pod Security Admission and, on aws, readiness-gate injection."""
    labels = {contract.LABEL_ENVIRONMENT: spec.environment, "app.kubernetes.io/part-of": "llmfleet"}
    labels |= pod_security_labels(spec)
    if spec.target == "aws":
        labels[READINESS_GATE_LABEL] = "enabled"
    return labels


def sha256_text(text: str) -> str:
    """The hex sha256 of ``text`` (UTF-8): a pod template checksum."""
    return hashlib.sha256(text.encode()).hexdigest()


def secret_checksum(value: pulumi.Input[str]) -> pulumi.Output[str]:
    """`sha256_text` of a secret or computed value; the checksum stays secret when the value is."""
    return pulumi.Output.from_input(value).apply(lambda v: sha256_text(str(v)))


def pod_security_context() -> dict[str, Any]:
    """A pod running as the images' user (uid/gid 10001), its volumes group-owned by it, the runtime's seccomp."""
    return {
        "run_as_non_root": True,
        "run_as_user": IMAGE_UID,
        "run_as_group": IMAGE_UID,
        "fs_group": IMAGE_UID,
        "seccomp_profile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool) -> dict[str, Any]:
    """No privilege escalation, no capabilities; a read-only root file system where the process allows it."""
    return {
        "allow_privilege_escalation": False,
        "capabilities": {"drop": ["ALL"]},
        "read_only_root_filesystem": read_only_root,
    }


def control_plane_url(spec: FleetSpec) -> str:
    """Where agents and gateways reach the control plane: the stack's URL, else the in-cluster Service."""
    if spec.control_plane.url:
        return spec.control_plane.url
    namespace = spec.cluster.namespace
    return f"http://{contract.CONTROL_PLANE_NAME}.{namespace}.svc.cluster.local:{spec.control_plane.port}"


def render_stack_file(spec: FleetSpec) -> str:
    """The stack file the containers load (``--stack``): the spec as deployed, control plane URL resolved."""
    deployed = spec.model_copy(
        update={"control_plane": spec.control_plane.model_copy(update={"url": control_plane_url(spec)})}
    )
    values = deployed.model_dump(mode="json", by_alias=True, exclude_none=True)
    document = {"config": {f"{NAMESPACE}:{key}": value for key, value in values.items()}}
    header = f"# Rendered by `pulumi up -s {spec.environment}`; edit stacks/Pulumi.{spec.environment}.yaml instead.\n"
    return header + yaml.safe_dump(document, sort_keys=False)


@dataclass(frozen=True)
class SecretFile:
    """One key of a Secret mounted read-only as ``<directory>/<key>``, and the variable a process reads it from."""

    variable: str  # what the process reads, exported from the file by `llmfleet_command`
    secret: str
    key: str
    directory: str
    volume: str

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.key}"

    def volume_spec(self) -> dict[str, Any]:
        return {
            "name": self.volume,
            "secret": {"secret_name": self.secret, "items": [{"key": self.key, "path": self.key}]},
        }

    def mount(self) -> dict[str, Any]:
        return {"name": self.volume, "mount_path": self.directory, "read_only": True}


# The engines' API key: for engine and gateway containers only.
ENGINE_API_KEY_FILE = SecretFile(
    variable=ENGINE_API_KEY_ENV,
    secret=contract.ENGINE_API_KEY_SECRET,
    key=contract.ENGINE_API_KEY_SECRET_KEY,
    directory="/etc/llmfleet/engine-api-key",
    volume="engine-api-key",
)


def llmfleet_command(files: Sequence[SecretFile] = ()) -> list[str]:
    """The container's ``command``: ``llmfleet``, started by ``/bin/sh`` with each of ``files`` read into its variable
    when there are any (the pod's ``args`` become ``"$@"``). ``set -e``: a missing file stops the container before
    ``llmfleet`` starts. ``$$`` is Kubernetes' escape for ``$`` (it expands ``$(NAME)`` in commands)."""
    if not files:
        return ["llmfleet"]
    steps = ["set -e"]
    for item in files:
        steps += [f'{item.variable}="$$(cat {shlex.quote(item.path)})"', f"export {item.variable}"]
    steps.append('exec llmfleet "$@"')
    return ["/bin/sh", "-c", "; ".join(steps), "llmfleet"]


HOME_DIR = "/home/llmfleet"  # the images' user's home (the engine image's HOME), an emptyDir on the cluster


def home_volume(size: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(volume, mount, variable): a writable ``$HOME`` of at most ``size`` on a read-only root file system, for what
    libraries cache under ``~/.cache`` and ``~/.config``."""
    volume = {"name": "home", "empty_dir": {"size_limit": size}}
    return volume, {"name": "home", "mount_path": HOME_DIR}, {"name": "HOME", "value": HOME_DIR}


def irsa_annotations(role_arn: pulumi.Input[str] | None) -> dict[str, pulumi.Input[str]]:
    """A ServiceAccount's annotations binding it to an IRSA role (none without one): EKS's pod identity webhook then
    gives its pods the role's credentials."""
    return {} if role_arn is None else {"eks.amazonaws.com/role-arn": role_arn}


def model_bucket_env(bucket: pulumi.Input[str] | None) -> list[dict[str, Any]]:
    """``$LLMFLEET_MODEL_BUCKET``, the stack's model bucket (none without one): engines fetch their model from it,
    gateways their pools' tokenizers."""
    return [] if bucket is None else [{"name": contract.MODEL_BUCKET_ENV, "value": bucket}]


def http_probe(path: str, port: int, period: int, failures: int, scheme: str = "HTTP") -> dict[str, Any]:
    return {
        "http_get": {"path": path, "port": port, "scheme": scheme},
        "period_seconds": period,
        "failure_threshold": failures,
        "timeout_seconds": 2,
    }


def spec_volumes(spec: FleetSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) for the stack file and the tenant key hashes, read-only."""
    volumes = [
        {"name": "stack", "config_map": {"name": contract.SPEC_CONFIGMAP}},
        {"name": "tenant-keys", "secret": {"secret_name": contract.TENANT_KEYS_SECRET}},
    ]
    mounts = [
        {"name": "stack", "mount_path": contract.STACKS_DIR, "read_only": True},
        {"name": "tenant-keys", "mount_path": contract.SECRETS_DIR, "read_only": True},
    ]
    return volumes, mounts


@dataclass(frozen=True)
class FleetBaseArgs:
    spec: FleetSpec
    tenant_key_hashes: pulumi.Input[str]  # JSON {tenant: [sha256:...]}
    engine_api_key: pulumi.Input[str]  # secret: engines require it, gateways send it
    engine_role_arn: pulumi.Input[str] | None = None  # IRSA role of the engines (aws target)


class FleetBase(pulumi.ComponentResource):
    """Namespace, stack-file ConfigMap, tenant-keys Secret, engine API key Secret, the engines' ServiceAccount."""

    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: FleetBaseArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:FleetBase", name, None, opts)
        spec = args.spec
        labels = {contract.LABEL_ENVIRONMENT: spec.environment, "app.kubernetes.io/part-of": "llmfleet"}
        ns = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": spec.cluster.namespace, "labels": namespace_labels(spec)},
            opts=pulumi.ResourceOptions(parent=self),
        )
        child = pulumi.ResourceOptions(parent=self, depends_on=[ns])
        meta: k8s.meta.v1.ObjectMetaArgsDict = {"namespace": spec.cluster.namespace, "labels": labels}
        k8s.core.v1.ConfigMap(
            f"{name}-spec",
            metadata={**meta, "name": contract.SPEC_CONFIGMAP},
            data={f"Pulumi.{spec.environment}.yaml": render_stack_file(spec)},
            opts=child,
        )
        k8s.core.v1.Secret(
            f"{name}-tenant-keys",
            metadata={**meta, "name": contract.TENANT_KEYS_SECRET},
            type="Opaque",
            string_data={"tenant-keys.json": args.tenant_key_hashes},
            opts=child,
        )
        k8s.core.v1.Secret(
            f"{name}-engine-api-key",
            metadata={**meta, "name": contract.ENGINE_API_KEY_SECRET},
            type="Opaque",
            string_data={contract.ENGINE_API_KEY_SECRET_KEY: pulumi.Output.secret(args.engine_api_key)},
            opts=child,
        )
        k8s.core.v1.ServiceAccount(
            f"{name}-engine",
            metadata={
                **meta,
                "name": contract.ENGINE_SERVICE_ACCOUNT,
                "annotations": irsa_annotations(args.engine_role_arn),
            },
            automount_service_account_token=False,
            opts=child,
        )
        self.namespace = ns.metadata.apply(lambda m: str(m.name))
        self.register_outputs({"namespace": self.namespace})
