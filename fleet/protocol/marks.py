"""Marks: annotations the Pulumi program writes for the first-``up`` policies, and the load balancer facts they use.

The program (`infra`) writes them; the policy pack (`policies.first_up`) reads them back from the recorded graph,
so a check never has to re-derive a stack's numbers from its file.
"""

from __future__ import annotations

__all__ = [
    "ANN_CHECKSUM_ENGINE_KEY",
    "ANN_CHECKSUM_POOL",
    "ANN_CHECKSUM_STACK",
    "ANN_CHECKSUM_TENANT_KEYS",
    "ANN_FIRST_READY",
    "ANN_NAMESPACE_EXISTING",
    "ANN_PULUMI_TIMEOUT",
    "ANN_RESUME_STREAMS",
    "DEFAULT_AWAIT_S",
    "LB_DEREGISTRATION_DELAY",
    "NLB_DEFAULT_DEREGISTRATION_DELAY_S",
    "NLB_DEREGISTRATION_S",
    "NLB_TLS_IDLE_TIMEOUT_S",
    "READINESS_GATE_LABEL",
    "SYSTEM_NAMESPACES",
]

# On an engine Deployment: the seconds its first replica may take to turn Ready on a new node (image pull plus the
# pool's coldStartSeconds).
ANN_FIRST_READY = "llmfleet.io/first-ready-seconds"
# On an engine Deployment: "true" when the gateway resumes the pool's interrupted streams on another replica.
ANN_RESUME_STREAMS = "llmfleet.io/resume-streams"
# On an object in a namespace the program does not create: "existing" says the cluster already has it (the
# Prometheus namespace of a cluster the stack does not own).
ANN_NAMESPACE_EXISTING = "llmfleet.io/namespace"
# Namespaces every Kubernetes cluster has.
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# pulumi-kubernetes' own await timeout annotation: used when the resource has no customTimeouts
# (pulumi/pulumi-kubernetes provider/pkg/metadata/overrides.go, TimeoutDuration).
ANN_PULUMI_TIMEOUT = "pulumi.com/timeoutSeconds"
# Pulumi's await of a Deployment, and Kubernetes' default progressDeadlineSeconds: both 600 s.
DEFAULT_AWAIT_S = 600

# On pod templates: sha256 of what the pod reads at start, so that `pulumi up` rolls the pods when it changes.
ANN_CHECKSUM_STACK = "checksum.llmfleet.io/stack-file"  # the rendered stack file (gateway, control plane)
ANN_CHECKSUM_POOL = "checksum.llmfleet.io/pool"  # the parts of the stack file an engine's agent reads
ANN_CHECKSUM_TENANT_KEYS = "checksum.llmfleet.io/tenant-keys"  # the tenant key hashes (gateway)
ANN_CHECKSUM_ENGINE_KEY = "checksum.llmfleet.io/engine-api-key"  # the engines' API key (gateway, engines)

# The AWS Load Balancer Controller injects target-health readiness gates into pods of namespaces labelled so
# (kubernetes-sigs/aws-load-balancer-controller docs/deploy/pod_readiness_gate.md).
READINESS_GATE_LABEL = "elbv2.k8s.aws/pod-readiness-gate-inject"
LB_DEREGISTRATION_DELAY = "deregistration_delay.timeout_seconds"  # a target group attribute

# An NLB TLS listener's idle timeout: fixed, not settable (docs.aws.amazon.com/elasticloadbalancing/latest/network/
# update-idle-timeout.html); the controller skips listener attributes on TLS listeners.
NLB_TLS_IDLE_TIMEOUT_S = 350
# An NLB keeps sending new connections to a deregistering IP target for about two minutes, whatever its
# deregistration delay (kubernetes-sigs/aws-load-balancer-controller#2366, #3270).
NLB_DEREGISTRATION_S = 120
NLB_DEFAULT_DEREGISTRATION_DELAY_S = 300  # a target group's deregistration delay when no attribute sets it
