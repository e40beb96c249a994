"""Validate: cross-field checks of a FleetSpec against the catalogue, the plugin registries and itself.

`check_spec` never raises: it returns every `Problem` found (errors and warnings) so a user fixes a stack
file in one pass. Each problem names the full key path and what is allowed.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import math
from collections.abc import Iterator, Sequence
from typing import Any

from fleet.capacity.catalog import GIB, GPUS, INSTANCES, MODELS, ec2_instance_types
from fleet.capacity.paid import plan_groups
from fleet.capacity.perf import kv_bytes_per_token
from fleet.capacity.plan import (
    ACTIVATION_RESERVE_GIB,
    KV_BLOCK_TOKENS,
    concurrency_that_fits,
    kv_budget_bytes,
    model_facts,
    plan_pool,
    pool_gpu,
)
from fleet.protocol import contract
from fleet.spec.errors import Problem, key_error as _err, key_warning as _warn
from fleet.spec.placeholders import PLACEHOLDER_DIGEST, ROLE_ARN, placeholder_problems
from fleet.spec.plugins import (
    ACTUATOR,
    ENGINE_KIND,
    ROUTING_FILTER,
    ROUTING_PICKER,
    ROUTING_SCORER,
    SCALING_POLICY,
    Registry,
)
from fleet.spec.stack import DRAIN_MARGIN_S, FleetSpec, PoolSpec
from fleet.spec.validate_models import check_adapter_routing, check_aliases, check_unique_names
from fleet.spec.validate_timing import check_timing

__all__ = ["DEMO_API_KEY", "PLACEHOLDER_DIGEST", "check_spec", "hash_api_key"]

# The local stack's demo key. Local-only: any other stack carrying its hash is rejected.
DEMO_API_KEY = "sk-llmfleet-demo"


def hash_api_key(key: str) -> str:
    """The form in which keys are stored: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def check_spec(spec: FleetSpec, registries: Sequence[Registry[Any]] = ()) -> list[Problem]:
    """Every cross-field problem of ``spec`` (order follows the file).

    Plugin names and parameters are checked against ``registries``, the registries of the components the caller
    runs; a plugin kind without a registry here is not checked (``llmfleet validate`` passes every registry).
    """
    problems = _check_plugins(spec, {r.kind: r for r in registries})
    problems += _check_zones_and_groups(spec)
    for index, pool in enumerate(spec.pools):
        problems += _check_pool(spec, index, pool)
    problems += _check_cost(spec)
    problems += check_unique_names(spec)
    problems += _check_tenants(spec)
    problems += _check_gateway(spec)
    problems += check_timing(spec)
    problems += _check_images(spec)
    problems += _check_cluster_access(spec)
    problems += placeholder_problems(spec)  # warnings here; errors on `pulumi up` (infra.config)
    problems += check_aliases(spec)
    problems += check_adapter_routing(spec)
    return problems


def _check_plugins(spec: FleetSpec, registries: dict[str, Registry[Any]]) -> list[Problem]:
    refs: list[tuple[str, str, str, dict[str, Any], bool]] = []  # (kind, path, name, params, has params)
    routing = spec.gateway.routing
    for kind, key, plugins in (
        (ROUTING_FILTER, "filters", routing.filters),
        (ROUTING_SCORER, "scorers", routing.scorers),
    ):
        refs += [(kind, f"gateway.routing.{key}[{i}]", p.name, p.params, True) for i, p in enumerate(plugins)]
    refs.append((ROUTING_PICKER, "gateway.routing.picker", routing.picker.name, routing.picker.params, True))
    policy = spec.autoscaling.policy
    refs.append((SCALING_POLICY, "autoscaling.policy", policy.name, policy.params, True))
    refs.append((ACTUATOR, "autoscaling.actuator", spec.autoscaling.actuator, {}, False))
    refs += [(ENGINE_KIND, f"pools[{i}].engine.kind", p.engine.kind, {}, False) for i, p in enumerate(spec.pools)]
    problems: list[Problem] = []
    for kind, path, name, params, has_params in refs:
        registry = registries.get(kind)
        if registry is None:
            continue
        if has_params:
            problems += registry.check(name, params, f"{path}.name", f"{path}.params")
        else:
            problems += registry.check(name, params, path, None)
    return problems


def _check_zones_and_groups(spec: FleetSpec) -> Iterator[Problem]:
    zones = spec.availability_zones
    if len(set(zones)) != len(zones):
        yield _err("availabilityZones", "zones must be distinct", zones)
    if spec.target == "aws":
        for i, zone in enumerate(zones):
            if not zone.startswith(spec.region):
                yield _err(f"availabilityZones[{i}]", f"zone is not in region {spec.region!r}", zone)
    if spec.target == "aws":
        known = ec2_instance_types()
        cpu_type = spec.cpu_node_group.instance_type
        if cpu_type not in known:
            close = difflib.get_close_matches(cpu_type, sorted(known), n=3, cutoff=0.7)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            yield _err(
                "cpuNodeGroup.instanceType", f"not an EC2 instance type; {hint}(from botocore's EC2 model)", cpu_type
            )
        for i, group in enumerate(spec.gpu_node_groups):
            if group.instance_type in INSTANCES and group.instance_type not in known:
                yield _err(f"gpuNodeGroups[{i}].instanceType", "not an EC2 instance type", group.instance_type)
    if spec.target == "aws" and spec.cpu_node_group.instance_type.startswith(("p", "g")):
        yield _warn("cpuNodeGroup.instanceType", "a GPU instance type for the CPU node group wastes GPUs")
    if spec.cpu_node_group.min_nodes > spec.cpu_node_group.max_nodes:
        yield _err("cpuNodeGroup.minNodes", f"must be <= maxNodes ({spec.cpu_node_group.max_nodes})")
    cpu = spec.cpu_node_group
    if spec.target == "aws" and cpu.min_nodes < cpu.max_nodes and cpu.autoscaler == "none":
        # A maxNodes nothing reaches is a quota asked for and a cost quoted, while HPA growth past minNodes pends.
        yield _err(
            "cpuNodeGroup.maxNodes",
            f"nothing grows the CPU group above minNodes ({cpu.min_nodes}): the fleet's autoscaler resizes only GPU "
            f"node groups and the program installs no cluster-autoscaler; set maxNodes to {cpu.min_nodes} (or leave "
            "it out), or autoscaler: external when the cluster owner runs one",
            cpu.max_nodes,
        )
    names: set[str] = set()
    for i, group in enumerate(spec.gpu_node_groups):
        path = f"gpuNodeGroups[{i}]"
        if group.name in names:
            yield _err(f"{path}.name", "node group names must be unique", group.name)
        names.add(group.name)
        if group.instance_type not in INSTANCES:
            yield _err(
                f"{path}.instanceType",
                f"unknown GPU instance type; catalogue: {', '.join(INSTANCES)}",
                group.instance_type,
            )
        for j, zone in enumerate(group.zones or []):
            if zone not in zones:
                yield _err(f"{path}.zones[{j}]", f"not one of the stack's zones ({', '.join(zones)})", zone)
        if group.min_nodes_per_az > group.max_nodes_per_az:
            yield _err(f"{path}.minNodesPerAz", f"must be <= maxNodesPerAz ({group.max_nodes_per_az})")
        if spec.target == "aws" and group.capacity_type == "spot":
            yield _warn(
                f"{path}.capacityType",
                f"a Spot group runs one instance type ({group.instance_type}) and nothing falls back when it has no "
                "Spot capacity, which for large GPU types is most of the time (EKS advises several instance types "
                "for Spot); use on-demand at minNodesPerAz 0, or capacity-block",
            )


def _check_pool(spec: FleetSpec, index: int, pool: PoolSpec) -> Iterator[Problem]:
    path = f"pools[{index}]"
    engine = pool.engine
    if pool.node_group is not None and pool.node_group not in {g.name for g in spec.gpu_node_groups}:
        known = ", ".join(g.name for g in spec.gpu_node_groups) or "none declared"
        yield _err(f"{path}.nodeGroup", f"no such GPU node group; gpuNodeGroups: {known}", pool.node_group)
        return
    if pool.node_group is None and spec.target == "aws":
        yield _err(f"{path}.nodeGroup", "required on target 'aws': name one of gpuNodeGroups")
        return
    if pool.node_group is not None and spec.node_group(pool.node_group).instance_type not in INSTANCES:
        return  # reported on the node group
    if pool.gpu is not None and pool.gpu not in GPUS:
        yield _err(f"{path}.gpu", f"unknown GPU; catalogue: {', '.join(GPUS)}", pool.gpu)
        return
    if engine.sim.gpu_profile not in GPUS:
        yield _err(
            f"{path}.engine.sim.gpuProfile",
            f"unknown GPU profile; catalogue: {', '.join(GPUS)}",
            engine.sim.gpu_profile,
        )
        return
    if pool.model_facts is None and pool.model not in MODELS:
        yield _err(
            f"{path}.model",
            f"not in the model catalogue ({', '.join(MODELS)}); add llmfleet:{path}.modelFacts",
            pool.model,
        )
        return
    if spec.target == "aws" and engine.kind == "sim":
        yield _warn(f"{path}.engine.kind", "simulated engines on GPU nodes serve no real tokens")
    facts = model_facts(pool)
    gpu = pool_gpu(spec, pool)
    tp = engine.tensor_parallel_size
    if pool.node_group is not None:
        per_node = INSTANCES[spec.node_group(pool.node_group).instance_type].gpu_count
        if tp > per_node or per_node % tp:
            yield _err(
                f"{path}.engine.tensorParallelSize",
                f"must divide the node's {per_node} GPUs and be at most {per_node}",
                tp,
            )
            return
    budget = kv_budget_bytes(gpu, facts, tp, engine.gpu_memory_utilization)
    if budget <= 0:
        need = facts.parameters * 2 / GIB / tp + ACTIVATION_RESERVE_GIB
        yield _err(
            f"{path}.engine.tensorParallelSize",
            f"the model does not fit: it needs ~{need:.1f} GiB per GPU at TP {tp} but {gpu.name} offers "
            f"{gpu.memory_gib * engine.gpu_memory_utilization:.1f} GiB at gpuMemoryUtilization "
            f"{engine.gpu_memory_utilization}; raise TP or use a larger GPU",
            tp,
        )
        return
    kv_tokens = int(budget // kv_bytes_per_token(facts))
    if engine.max_model_len > facts.max_position:
        yield _err(
            f"{path}.engine.maxModelLen",
            f"must be <= the model's context length {facts.max_position}",
            engine.max_model_len,
        )
    if kv_tokens < engine.max_model_len:
        yield _err(
            f"{path}.engine.maxModelLen",
            f"one full-length sequence needs {engine.max_model_len} tokens of KV but only {kv_tokens} fit",
            engine.max_model_len,
        )
    if engine.max_num_batched_tokens < engine.max_num_seqs:
        yield _err(
            f"{path}.engine.maxNumBatchedTokens",
            f"must be >= maxNumSeqs ({engine.max_num_seqs})",
            engine.max_num_batched_tokens,
        )
    work = pool.workload
    if work.mean_prompt_tokens + work.mean_output_tokens > engine.max_model_len:
        yield _err(
            f"{path}.workload.meanPromptTokens",
            f"prompt + output ({work.mean_prompt_tokens}+{work.mean_output_tokens}) exceeds maxModelLen "
            f"{engine.max_model_len}",
        )
        return
    mean_context = work.mean_prompt_tokens + work.mean_output_tokens
    fits = concurrency_that_fits(kv_tokens // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS, mean_context, engine.max_num_seqs)
    if fits < engine.max_num_seqs:
        yield _warn(
            f"{path}.engine.maxNumSeqs",
            f"{engine.max_num_seqs} sequences of {mean_context} tokens exceed the KV budget "
            f"({kv_tokens} tokens); about {fits} fit before preemption",
        )
    window = pool.restart_window
    if window.enabled and window.max_unavailable >= max(1, pool.replicas.min):
        yield _warn(
            f"{path}.restartWindow.maxUnavailable",
            f"{window.max_unavailable} of a minimum of {pool.replicas.min} replicas may restart at once",
        )
    if pool.drain.propagation_seconds + DRAIN_MARGIN_S >= pool.drain.grace_seconds:
        yield _err(
            f"{path}.drain.graceSeconds",
            f"must exceed propagationSeconds + {DRAIN_MARGIN_S:g} "
            f"({pool.drain.propagation_seconds + DRAIN_MARGIN_S:g})",
            pool.drain.grace_seconds,
        )
    plan = plan_pool(spec, pool)
    for note in plan.notes:
        if "cannot reach" in note:
            yield _warn(f"{path}.workload.peakQps", note)
    if math.isclose(engine.gpu_memory_utilization, 0.98):
        yield _warn(f"{path}.engine.gpuMemoryUtilization", "0.98 leaves no room for other processes on the GPU")


def _check_cost(spec: FleetSpec) -> Iterator[Problem]:
    """The whole fleet's GPU nodes at peak against the ceiling: pools sharing a node group count its nodes once."""
    ceiling = spec.cost.monthly_ceiling_usd
    if ceiling is None:
        return
    peak = sum(g.at_peak.monthly_cost_usd for g in plan_groups(spec))
    if peak > ceiling:
        yield _warn("cost.monthlyCeilingUsd", f"the GPU nodes cost ${peak:,.0f}/month at peak, above the ceiling")


def _check_tenants(spec: FleetSpec) -> Iterator[Problem]:
    models = {p.served_name for p in spec.pools} | set(spec.aliases) | {a.name for p in spec.pools for a in p.adapters}
    names: set[str] = set()
    demo = hash_api_key(DEMO_API_KEY)
    for i, tenant in enumerate(spec.tenants):
        path = f"tenants[{i}]"
        if tenant.name in names:
            yield _err(f"{path}.name", "tenant names must be unique", tenant.name)
        names.add(tenant.name)
        if not tenant.api_key_hashes and tenant.api_keys_secret is None:
            yield _err(f"{path}.apiKeyHashes", "a tenant needs apiKeyHashes or apiKeysSecret")
        if spec.target != "local" and demo in tenant.api_key_hashes:
            yield _err(f"{path}.apiKeyHashes", "the demo key is for the local stack only; issue a real key")
        for j, model in enumerate(tenant.allowed_models):
            if model != "*" and model not in models:
                yield _err(
                    f"{path}.allowedModels[{j}]",
                    f"no pool or alias serves it; served: {', '.join(sorted(models))}",
                    model,
                )


def _check_gateway(spec: FleetSpec) -> Iterator[Problem]:
    gateway = spec.gateway
    drain = gateway.drain
    if drain.propagation_seconds + DRAIN_MARGIN_S >= drain.grace_seconds:
        yield _err(
            "gateway.drain.graceSeconds",
            f"must exceed propagationSeconds + {DRAIN_MARGIN_S:g} ({drain.propagation_seconds + DRAIN_MARGIN_S:g})",
            drain.grace_seconds,
        )
    elif drain.shutdown_timeout < gateway.timeouts.total_s:
        yield _warn(
            "gateway.drain.graceSeconds",
            f"in-flight requests get {drain.shutdown_timeout} s when a gateway pod stops (grace - propagation - "
            f"{DRAIN_MARGIN_S:g} s) but may run timeouts.totalS {gateway.timeouts.total_s:g} s: longer streams are "
            "cut on every rollout and scale-in",
        )
    if gateway.quota_backend == "redis" and gateway.redis_url is None and spec.target == "local":
        # On aws and kubernetes the Pulumi program provisions a Redis when the URL is unset.
        yield _err(
            "gateway.redisUrl", "required on target local when quotaBackend is 'redis' (e.g. redis://host:6379/0)"
        )
    if spec.target == "aws" and gateway.timeouts.total_s >= contract.NLB_MAX_IDLE_TIMEOUT_S:
        yield _err(
            "gateway.timeouts.totalS",
            f"below {contract.NLB_MAX_IDLE_TIMEOUT_S} on aws: the load balancer closes connections idle that long",
            gateway.timeouts.total_s,
        )
    yield from _check_gateway_tls(spec)
    if not gateway.routing.filters and not gateway.routing.scorers:
        yield _warn("gateway.routing", "no filters and no scorers: routing ignores load and health")
    for i, scorer in enumerate(gateway.routing.scorers):
        if scorer.weight == 0:
            yield _warn(f"gateway.routing.scorers[{i}].weight", "a weight of 0 disables this scorer")
    if spec.target != "local" and gateway.replicas < 2:
        yield _warn("gateway.replicas", "one gateway replica is a single point of failure")


def _check_gateway_tls(spec: FleetSpec) -> Iterator[Problem]:
    """A public gateway speaks TLS: bearer keys and prompts never cross a network in clear text."""
    tls = spec.gateway.tls
    if spec.target == "aws" and tls.secret_name is not None:
        yield _err("gateway.tls.secretName", "target kubernetes only; on aws set gateway.tls.certificateArn (ACM)")
    if spec.target != "aws" and tls.certificate_arn is not None:
        yield _err("gateway.tls.certificateArn", "target aws only; on kubernetes set gateway.tls.secretName")
    if spec.target == "local" or not spec.gateway.public:
        return
    if spec.target == "aws" and tls.certificate_arn is None:
        yield _err(
            "gateway.tls.certificateArn",
            "required for a public gateway on aws: an ACM certificate for the NLB's TLS listener "
            "(plain HTTP would carry API keys in clear text)",
        )
    if spec.target == "kubernetes" and tls.secret_name is None:
        yield _err(
            "gateway.tls.secretName",
            "required for a public gateway on kubernetes: a kubernetes.io/tls Secret in the namespace "
            "(plain HTTP would carry API keys in clear text)",
        )


def _check_images(spec: FleetSpec) -> Iterator[Problem]:
    """Cloud stacks pin their images by digest: runtime always, engine when a pool runs vLLM."""
    if spec.target == "local":
        return
    images = spec.images
    if spec.target == "aws" and images.registry is not None:
        yield _err(
            "images.registry",
            "not used on target aws: the images come from the stack's own ECR repositories "
            "(stack output imageRegistry); remove the key",
            images.registry,
        )
    if spec.target == "kubernetes" and images.registry is None:
        yield _err(
            "images.registry",
            "required on target kubernetes: where the images are pushed, e.g. ghcr.io/acme/llmfleet "
            "(pods pull <registry>/runtime@<runtimeDigest>)",
        )
    engine_pools = [f"pools[{i}] ({p.name})" for i, p in enumerate(spec.pools) if p.runs_engine_image]
    needed = [("runtimeDigest", images.runtime_digest, "runtime", f"required on target {spec.target}")]
    if engine_pools:
        needed.append(("engineDigest", images.engine_digest, "engine", f"required: {', '.join(engine_pools)} run vLLM"))
    for key, digest, image, why in needed:
        if digest is None:
            yield _err(
                f"images.{key}",
                f"{why}. `images/build.sh {image}` (or `make images IMAGES={image}`) builds the image and prints "
                f"its digest; pin it with `pulumi config set --path 'llmfleet:images.{key}' sha256:... "
                f"-s {spec.environment}` or in the stack file",
            )


PRODUCTION_ENVIRONMENTS = frozenset({"prod", "production"})  # held to the strictest cluster access rules
# What CloudWatch Logs accepts as a retention, in days.
LOG_RETENTION_DAYS = (
    *(1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545),
    *(731, 1096, 1827, 2192, 2557, 2922, 3288, 3653),
)


def _check_cluster_access(spec: FleetSpec) -> Iterator[Problem]:
    """The EKS API endpoint's public CIDRs, the access-entry roles and the control-plane log retention."""
    cluster = spec.cluster
    for i, cidr in enumerate(cluster.public_endpoint_cidrs):
        path = f"cluster.publicEndpointCidrs[{i}]"
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            yield _err(path, "not a CIDR block; use an address range such as 203.0.113.0/24", cidr)
            continue
        if network.prefixlen == 0:
            what = (
                "opens the Kubernetes API endpoint to the whole internet; list your office, VPN or CI egress "
                "ranges instead (or none: the API is then reachable only from inside the VPC)"
            )
            if spec.environment in PRODUCTION_ENVIRONMENTS:
                yield _err(path, f"not allowed on a production stack: {what}", cidr)
            else:
                yield _warn(path, what)
    for key, arns in (("adminRoleArns", cluster.admin_role_arns), ("ciRoleArns", cluster.ci_role_arns)):
        for i, arn in enumerate(arns):
            if not ROLE_ARN.match(arn):
                yield _err(
                    f"cluster.{key}[{i}]", "not an IAM role ARN (arn:aws:iam::<12-digit account>:role/<name>)", arn
                )
    if cluster.log_retention_days not in LOG_RETENTION_DAYS:
        allowed = ", ".join(str(d) for d in LOG_RETENTION_DAYS)
        yield _err(
            "cluster.logRetentionDays", f"not a CloudWatch Logs retention; one of {allowed}", cluster.log_retention_days
        )
