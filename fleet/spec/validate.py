"""Validate: cross-field checks of a FleetSpec against the catalogue, the plugin registries and itself.

`check_spec` never raises: it returns every `Problem` found (errors and warnings) so a user fixes a stack
file in one pass. Each problem names the full key path and what is allowed. The checks live by concern: plugins
here, pools in `fleet.spec.validate_pool`, zones, node groups, cost, images and cluster access in
`fleet.spec.validate_cluster`, tenants and the gateway in `fleet.spec.validate_gateway`, timing in
`fleet.spec.validate_timing`, prefill/decode pairs in `fleet.spec.validate_disagg`, names, aliases and adapters
in `fleet.spec.validate_models`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.spec.errors import Problem
from fleet.spec.placeholders import placeholder_problems
from fleet.spec.plugins import (
    ACTUATOR,
    ENGINE_KIND,
    ROUTING_FILTER,
    ROUTING_PICKER,
    ROUTING_SCORER,
    SCALING_POLICY,
    Registry,
)
from fleet.spec.stack import FleetSpec
from fleet.spec.validate_cluster import check_cluster_access, check_cost, check_images, check_zones_and_groups
from fleet.spec.validate_disagg import check_disaggregation
from fleet.spec.validate_gateway import check_gateway, check_tenants
from fleet.spec.validate_models import check_adapter_routing, check_aliases, check_kv_routing, check_unique_names
from fleet.spec.validate_pool import check_pool
from fleet.spec.validate_timing import check_timing

__all__ = ["check_spec"]


def check_spec(spec: FleetSpec, registries: Sequence[Registry[Any]] = ()) -> list[Problem]:
    """Every cross-field problem of ``spec`` (order follows the file).

    Plugin names and parameters are checked against ``registries``, the registries of the components the caller
    runs; a plugin kind without a registry here is not checked (``llmfleet validate`` passes every registry).
    """
    problems = _check_plugins(spec, {r.kind: r for r in registries})
    problems += check_zones_and_groups(spec)
    for index, pool in enumerate(spec.pools):
        problems += check_pool(spec, index, pool)
    problems += check_cost(spec)
    problems += check_unique_names(spec)
    problems += check_tenants(spec)
    problems += check_gateway(spec)
    problems += check_timing(spec)
    problems += check_images(spec)
    problems += check_cluster_access(spec)
    problems += placeholder_problems(spec)  # warnings here; errors on `pulumi up` (infra.config)
    problems += check_aliases(spec)
    problems += check_adapter_routing(spec)
    problems += check_kv_routing(spec)
    problems += check_disaggregation(spec)
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
