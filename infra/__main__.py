"""The Pulumi program (``main: infra/``): read the stack's FleetSpec, build it, export what operators need."""

from __future__ import annotations

import pulumi

from infra.config import capacity_reservations, redis_auth_token, spec_from_config, tenant_key_hashes
from infra.program import FleetInputs, LocalTarget, build_fleet

spec = spec_from_config(pulumi.get_stack())
if spec.target == "local":
    raise pulumi.RunError(str(LocalTarget(spec.environment)))
outputs = build_fleet(FleetInputs(spec, tenant_key_hashes(spec), capacity_reservations(spec), redis_auth_token(spec)))
for key, value in outputs.items():
    pulumi.export(key, value)
