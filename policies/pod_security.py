"""Pod security rules: engine pods run as a non-root user and cannot gain privileges; API tokens only in pods that
call the API, secrets as files, read-only roots for engines and gateways (what cluster scanners flag: CIS
Kubernetes 5.1.6 and 5.4.1, kubesec/trivy KSV014).

* ``api-token-only-where-used`` (stack): a pod that mounts its service account's API token
  (``automountServiceAccountToken``: the pod's, else its ServiceAccount's in the stack, else Kubernetes' default
  true) runs under an account that some RoleBinding or ClusterRoleBinding of the stack grants rights: an account
  with no rights makes no API call worth a token. The projected ``llmfleet``-audience control token is no API
  credential (the API server refuses its audience) and is not counted.
* ``secrets-mounted-as-files``: no container takes a Secret through ``env`` (``valueFrom.secretKeyRef``) or
  ``envFrom`` (``secretRef``).
* ``engines-and-gateways-read-only-root``: every container of an engine or gateway Deployment sets
  ``securityContext.readOnlyRootFilesystem: true``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import (
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.protocol import contract
from policies.common import DEPLOYMENT, as_int, get_path, is_engine, labels, mapping, pod_spec, sequence

__all__ = [
    "WORKLOADS",
    "api_token_only_where_used",
    "engines_and_gateways_read_only_root",
    "engines_run_as_non_root",
    "root_problems",
    "secret_env_problems",
    "secrets_mounted_as_files",
    "workload_pod",
]


def _true(value: object) -> bool:
    return value is True or str(value).lower() == "true"


def root_problems(pod: Mapping[str, Any]) -> list[str]:
    """What lets a container of ``pod`` run as root or gain privileges (container settings override the pod's)."""
    pod_context = mapping(pod.get("securityContext"))
    problems: list[str] = []
    for key in ("initContainers", "containers"):
        for item in sequence(pod.get(key)):
            container = mapping(item)
            context = mapping(container.get("securityContext"))
            name = container.get("name") or "?"
            user = as_int(context.get("runAsUser", pod_context.get("runAsUser")))
            non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
            if user == 0:
                problems.append(f"{name!r} runs as uid 0")
            elif not _true(non_root):
                problems.append(f"{name!r} does not set runAsNonRoot")
            if not (
                context.get("allowPrivilegeEscalation") is False or _false(context.get("allowPrivilegeEscalation"))
            ):
                problems.append(f"{name!r} may escalate privileges (allowPrivilegeEscalation is not false)")
            if _true(context.get("privileged")):
                problems.append(f"{name!r} is privileged")
    return problems


def _false(value: object) -> bool:
    return str(value).lower() == "false"


def engines_run_as_non_root_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    problems = root_problems(pod_spec(args.props))
    if problems:
        name = get_path(args.props, "metadata", "name") or args.name
        report_violation(
            f"engine Deployment {name!r}: {'; '.join(problems)}. Risk: engines load third-party model code and "
            "serve tenants' prompts; a compromised engine running as root owns the node's model cache and "
            "driver files and is one kernel or runtime flaw away from the node and its GPUs.",
            None,
        )


engines_run_as_non_root = ResourceValidationPolicy(
    name="engines-run-as-non-root",
    description="Engine pods (init containers included) run as non-root without privilege escalation.",
    validate=engines_run_as_non_root_validator,
)


SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
BINDINGS = (
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
)
WORKLOADS = (
    DEPLOYMENT,
    "kubernetes:apps/v1:DaemonSet",
    "kubernetes:apps/v1:StatefulSet",
    "kubernetes:apps/v1:ReplicaSet",
    "kubernetes:batch/v1:Job",
    "kubernetes:batch/v1:CronJob",
    "kubernetes:core/v1:Pod",
)


def workload_pod(resource_type: str, props: Any) -> Mapping[str, Any] | None:
    """The pod spec of a workload resource (a Pod's own spec, a CronJob's job template's); None for other types."""
    if resource_type not in WORKLOADS:
        return None
    if resource_type == "kubernetes:core/v1:Pod":
        return mapping(props.get("spec"))
    if resource_type == "kubernetes:batch/v1:CronJob":
        return mapping(get_path(props, "spec", "jobTemplate", "spec", "template", "spec"))
    return mapping(get_path(props, "spec", "template", "spec"))


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers"):
        for item in sequence(pod.get(key)):
            yield mapping(item)


def _name(props: Any, fallback: str) -> str:
    return str(get_path(props, "metadata", "name") or fallback)


def _namespace(props: Any) -> str:
    return str(get_path(props, "metadata", "namespace") or "default")


# api-token-only-where-used


def _bound_accounts(resources: Any) -> set[tuple[str, str]]:
    """(namespace, name) of every ServiceAccount a binding of the stack names as a subject."""
    bound: set[tuple[str, str]] = set()
    for resource in resources:
        if resource.resource_type not in BINDINGS:
            continue
        for subject in sequence(resource.props.get("subjects")):
            subject = mapping(subject)
            if subject.get("kind") == "ServiceAccount":
                namespace = subject.get("namespace") or _namespace(resource.props)
                bound.add((str(namespace), str(subject.get("name"))))
    return bound


def _account_automount(resources: Any) -> dict[tuple[str, str], Any]:
    """(namespace, name) -> the ServiceAccount's ``automountServiceAccountToken`` (None when unset)."""
    return {
        (_namespace(r.props), _name(r.props, r.name)): r.props.get("automountServiceAccountToken")
        for r in resources
        if r.resource_type == SERVICE_ACCOUNT
    }


def api_token_only_where_used_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    bound = _bound_accounts(args.resources)
    accounts = _account_automount(args.resources)
    for resource in args.resources:
        pod = workload_pod(resource.resource_type, resource.props)
        if pod is None:
            continue
        namespace = _namespace(resource.props)
        account = (namespace, str(pod.get("serviceAccountName") or "default"))
        automount = pod.get("automountServiceAccountToken")
        if automount is None:
            automount = accounts.get(account)
        if automount is False or _false(automount) or account in bound:
            continue
        kind = resource.resource_type.rsplit(":", 1)[-1]
        report_violation(
            f"{kind} {_name(resource.props, resource.name)!r} mounts the API token of service account "
            f"{account[1]!r} ({namespace}), which no RoleBinding or ClusterRoleBinding of the stack grants anything: "
            "its pods make no Kubernetes API call, so set automountServiceAccountToken: false on the pod or the "
            "account. Risk: whoever runs code in the pod (a model's custom code, a library flaw) reads "
            "/var/run/secrets/kubernetes.io/serviceaccount/token and speaks to the API server as the pod, with "
            "whatever the account is granted later or by the cluster's defaults.",
            resource.urn,
        )


api_token_only_where_used = StackValidationPolicy(
    name="api-token-only-where-used",
    description=(
        "Pods mount a Kubernetes API token only when their service account is bound to a role: pods that make no "
        "API call set automountServiceAccountToken: false (on the pod or its ServiceAccount)."
    ),
    validate=api_token_only_where_used_validator,
)


# secrets-mounted-as-files


def secret_env_problems(pod: Mapping[str, Any]) -> list[str]:
    """Each variable or ``envFrom`` of ``pod``'s containers taken from a Secret."""
    problems: list[str] = []
    for container in _containers(pod):
        name = container.get("name") or "?"
        for variable in sequence(container.get("env")):
            ref = mapping(get_path(variable, "valueFrom", "secretKeyRef"))
            if ref:
                problems.append(
                    f"{name!r} takes ${mapping(variable).get('name')} from Secret {ref.get('name')!r} "
                    f"(key {ref.get('key')!r})"
                )
        for source in sequence(container.get("envFrom")):
            ref = mapping(mapping(source).get("secretRef"))
            if ref:
                problems.append(f"{name!r} takes every key of Secret {ref.get('name')!r} as variables")
    return problems


def secrets_mounted_as_files_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    pod = workload_pod(args.resource_type, args.props)
    if pod is None:
        return
    problems = secret_env_problems(pod)
    if problems:
        report_violation(
            f"{args.resource_type.rsplit(':', 1)[-1]} {_name(args.props, args.name)!r}: {'; '.join(problems)}. "
            "Mount the Secret as a read-only volume and read the file. Risk: a secret in the environment is "
            "inherited by every child process, shows in /proc/<pid>/environ, crash reports and debug dumps, and "
            "never follows a rotation of the Secret.",
            None,
        )


secrets_mounted_as_files = ResourceValidationPolicy(
    name="secrets-mounted-as-files",
    description="Secrets reach containers as mounted files, never as environment variables (secretKeyRef, envFrom).",
    validate=secrets_mounted_as_files_validator,
)


# engines-and-gateways-read-only-root


def _engine_or_gateway(resource_type: str, props: Any) -> str | None:
    if resource_type != DEPLOYMENT:
        return None
    template = mapping(get_path(props, "spec", "template", "metadata", "labels"))
    component = labels(props).get(contract.LABEL_COMPONENT) or template.get(contract.LABEL_COMPONENT)
    return str(component) if component in (contract.COMPONENT_ENGINE, contract.COMPONENT_GATEWAY) else None


def engines_and_gateways_read_only_root_validator(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    component = _engine_or_gateway(args.resource_type, args.props)
    if component is None:
        return
    pod = mapping(get_path(args.props, "spec", "template", "spec"))
    writable = [
        str(c.get("name") or "?")
        for c in _containers(pod)
        if not _true(get_path(c, "securityContext", "readOnlyRootFilesystem"))
    ]
    if writable:
        report_violation(
            f"{component} Deployment {_name(args.props, args.name)!r}: container(s) {', '.join(map(repr, writable))} "
            "run on a writable root file system (securityContext.readOnlyRootFilesystem is not true); mount "
            "emptyDirs where the process writes (/tmp, $HOME, caches). Risk: code run in the container (a model's "
            "custom code, an injected payload) can replace the image's programs and libraries and persist until the "
            "pod is deleted.",
            None,
        )


engines_and_gateways_read_only_root = ResourceValidationPolicy(
    name="engines-and-gateways-read-only-root",
    description="Engine and gateway containers run on a read-only root file system, writing only to volumes.",
    validate=engines_and_gateways_read_only_root_validator,
)
