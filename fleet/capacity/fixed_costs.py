"""Fixed costs: what an aws stack pays every month whatever its pools do (control plane, NAT, endpoints).

Priced from the catalogue's list prices (`fleet.capacity.catalog.EKS_CONTROL_PLANE`, `NAT_GATEWAY`, `VPC_ENDPOINTS`) at
730 hours a month. The program makes one NAT gateway per zone and an S3 gateway endpoint on the private route
tables (`infra.network`), and no interface endpoint. Traffic-priced items (NAT data, the NLB's capacity units)
appear as a rate in the basis, not in the figure. Not priced here: the CPU node group, the NLB's hourly charge,
the quota Redis and storage (docs/cloud.md prices them by hand).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from fleet.capacity.catalog import EKS_CONTROL_PLANE, EKS_STANDARD_SUPPORT_ENDS, NAT_GATEWAY, VPC_ENDPOINTS
from fleet.capacity.plan import HOURS_PER_MONTH
from fleet.spec.stack import FleetSpec

__all__ = ["FixedCost", "fixed_costs"]


@dataclass(frozen=True)
class FixedCost:
    """One monthly charge: what it is, USD a month, and how that figure is made."""

    item: str
    monthly_usd: float
    basis: str


def _control_plane(version: str, today: datetime.date) -> FixedCost:
    """The EKS control plane at the price of the support ``version`` is in on ``today``."""
    standard, extended = EKS_CONTROL_PLANE["standard"], EKS_CONTROL_PLANE["extended"]
    ends = EKS_STANDARD_SUPPORT_ENDS.get(version)
    if ends is not None and today > datetime.date.fromisoformat(ends):
        return FixedCost(
            "EKS control plane",
            extended.usd * HOURS_PER_MONTH,
            f"${extended.usd:.2f}/h: Kubernetes {version} left standard support on {ends}, and extended support "
            f"costs ${extended.usd - standard.usd:.2f}/h more; upgrade the cluster",
        )
    until = f"until {ends}" if ends is not None else "(its dates are not in the catalogue)"
    return FixedCost(
        "EKS control plane",
        standard.usd * HOURS_PER_MONTH,
        f"${standard.usd:.2f}/h: Kubernetes {version} in standard support {until}; ${extended.usd:.2f}/h "
        f"(${extended.usd * HOURS_PER_MONTH:,.0f}/month) after it",
    )


def fixed_costs(spec: FleetSpec, today: datetime.date) -> list[FixedCost]:
    """The monthly fixed charges of ``spec`` on ``today`` (none off aws: an existing cluster's are its owner's)."""
    if spec.target != "aws":
        return []
    nat_hour, nat_gb = NAT_GATEWAY["hour"], NAT_GATEWAY["gb"]
    zones = len(spec.availability_zones)
    return [
        _control_plane(spec.cluster.kubernetes_version, today),
        FixedCost(
            "NAT gateways",
            zones * nat_hour.usd * HOURS_PER_MONTH,
            f"{zones} x ${nat_hour.usd:.3f}/h, plus ${nat_gb.usd:.3f} per GB they process",
        ),
        FixedCost(
            "S3 gateway endpoint",
            VPC_ENDPOINTS["s3-gateway-hour"].usd * HOURS_PER_MONTH,
            "no charge; weights and image layers reach S3 without crossing the NAT",
        ),
    ]
