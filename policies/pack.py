"""Pack: the list of llmfleet policies, in the order violations are reported, and the pack's enforcement level.

Every policy is mandatory unless it names its own level: a policy's ``enforcement_level`` of None takes the
pack's (pulumi_policy's ``PolicyPack``, and `policies.runner` the same way). The two advisory ones,
``prod-capacity-buffer`` and ``paid-gpu-utilisation``, say so where they are defined.
"""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, Policy

from policies.availability import (
    engine_grace_covers_drain,
    engine_has_pdb,
    engine_has_probes,
    prod_capacity_buffer,
    prod_min_replicas,
)
from policies.cluster import cluster_endpoint_restricted, imds_hop_limit_one
from policies.cost import allowed_instance_types, monthly_cost_ceiling
from policies.efa import (
    efa_cluster_placement,
    efa_device_plugin_installed,
    efa_requested_by_pd_pods,
    efa_security_group_allows_itself,
)
from policies.encryption import buckets_encrypted, cluster_secrets_encrypted, volumes_encrypted
from policies.first_up import (
    custom_resources_after_crds,
    namespaces_created_first,
    services_wait_for_lb_controller,
    slow_starts_awaited,
)
from policies.gpu import (
    gpu_capacity_spans_zones,
    gpu_memory_headroom,
    gpu_requests_match_tensor_parallel,
    pools_spread_across_zones,
)
from policies.images import images_from_stack_registries, images_pinned_by_digest
from policies.network import network_default_deny, only_gateway_public
from policies.paid_capacity import paid_gpu_utilisation
from policies.pod_security import (
    api_token_only_where_used,
    engines_and_gateways_read_only_root,
    engines_run_as_non_root,
    secrets_mounted_as_files,
)
from policies.prerequisites import cluster_prerequisites_installed
from policies.scaling import gpu_nodes_can_scale
from policies.timing import (
    engine_grace_covers_longest_request,
    gateway_drain_covers_deregistration,
    request_timeout_fits_listener,
)
from policies.tls import public_listener_tls

__all__ = ["ENFORCEMENT_LEVEL", "PACK_NAME", "POLICIES"]

PACK_NAME = "llmfleet"
ENFORCEMENT_LEVEL = EnforcementLevel.MANDATORY  # of every policy that names no level of its own

POLICIES: list[Policy] = [
    gpu_capacity_spans_zones,
    gpu_nodes_can_scale,
    pools_spread_across_zones,
    gpu_requests_match_tensor_parallel,
    gpu_memory_headroom,
    engine_has_pdb,
    engine_has_probes,
    engine_grace_covers_drain,
    engines_run_as_non_root,
    api_token_only_where_used,
    secrets_mounted_as_files,
    engines_and_gateways_read_only_root,
    prod_min_replicas,
    prod_capacity_buffer,
    only_gateway_public,
    network_default_deny,
    public_listener_tls,
    buckets_encrypted,
    volumes_encrypted,
    cluster_secrets_encrypted,
    imds_hop_limit_one,
    cluster_endpoint_restricted,
    allowed_instance_types,
    monthly_cost_ceiling,
    paid_gpu_utilisation,
    images_pinned_by_digest,
    images_from_stack_registries,
    cluster_prerequisites_installed,
    namespaces_created_first,
    services_wait_for_lb_controller,
    custom_resources_after_crds,
    slow_starts_awaited,
    request_timeout_fits_listener,
    gateway_drain_covers_deregistration,
    engine_grace_covers_longest_request,
    efa_device_plugin_installed,
    efa_security_group_allows_itself,
    efa_requested_by_pd_pods,
    efa_cluster_placement,
]
