"""Validate gateway: the tenants' keys and models, and the gateway's drain, quota backend, timeouts, TLS and routing.

Part of `fleet.spec.validate.check_spec`; each check yields `Problem`s and never raises.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleet.protocol import contract
from fleet.protocol.keys import DEMO_API_KEY, hash_api_key
from fleet.spec.errors import Problem, key_error as _err, key_warning as _warn
from fleet.spec.stack import DRAIN_MARGIN_S, FleetSpec

__all__ = ["check_gateway", "check_tenants"]


def check_tenants(spec: FleetSpec) -> Iterator[Problem]:
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


def check_gateway(spec: FleetSpec) -> Iterator[Problem]:
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
        elif gateway.routing.picker.name == "least-work" and scorer.name != "kv-cache":
            # The picker weighs tokens of work and reads only the share of the prompt kv-cache says is held.
            yield _warn(
                f"gateway.routing.scorers[{i}]",
                f"the least-work picker reads only kv-cache's share: {scorer.name!r} has no effect under it",
            )
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
