"""Catalogue: built-in facts about GPUs, GPU instances and models used by the memory and capacity math.

Figures are public vendor specifications (memory, HBM bandwidth, dense BF16 tensor throughput) and the
models' published configs. Efficiency factors turning peaks into achievable rates live in `fleet.capacity.perf`.

Prices are list prices with their source and the date of the source's data (`Price`): per instance type and
region on demand (`ON_DEMAND_PRICES`, Linux), spot apart (`SPOT_PRICES`), and the fleet's fixed AWS charges
(`EKS_CONTROL_PLANE`, `NAT_GATEWAY`, `VPC_ENDPOINTS`). Spot has no list price: EC2 sets it per zone from supply
and demand, and a spot request's default maximum is the on-demand price, so `instance_hour_usd` prices a spot
group with no recorded spot price at on demand, the most it can cost.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = [
    "CPU_BUILD_GPUS",
    "DTYPE_BYTES",
    "EKS_CONTROL_PLANE",
    "EKS_STANDARD_SUPPORT_ENDS",
    "GPUS",
    "INSTANCES",
    "MODELS",
    "NAT_GATEWAY",
    "ON_DEMAND_PRICES",
    "SPOT_PRICES",
    "VPC_ENDPOINTS",
    "GpuType",
    "InstanceType",
    "ModelFacts",
    "Price",
    "ec2_instance_types",
    "instance_hour_usd",
]

GIB = 1024**3

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "fp8": 1, "float32": 4, "auto": 2}


@dataclass(frozen=True)
class Price:
    """A list price: ``usd`` per ``unit`` (hour, GB, ...), from ``source``, whose data dates from ``as_of``."""

    usd: float
    source: str
    as_of: str  # YYYY-MM-DD
    unit: str = "hour"


# instances.vantage.sh data as the tsaol/aws-gpu repository snapshots it (data/*_instances.js, "Last updated").
_VANTAGE_2026_08 = "instances.vantage.sh via tsaol/aws-gpu@18aebd1d72819fea767dd5b5f835114120b2ad39"
_VANTAGE_2026_01 = "instances.vantage.sh via tsaol/aws-gpu@77fcd9fe1d0652fd07b830e5ed030d61da87923e"

# instance type -> region -> on-demand price per instance-hour (Linux). p5e.48xlarge has none: it is sold as
# capacity blocks, not on demand (the same data lists no region for it).
ON_DEMAND_PRICES: dict[str, dict[str, Price]] = {
    "p4d.24xlarge": {r: Price(21.957642, _VANTAGE_2026_08, "2026-08-26") for r in ("us-east-1", "us-west-2")},
    "p4de.24xlarge": {r: Price(27.44705, _VANTAGE_2026_01, "2026-01-21") for r in ("us-east-1", "us-west-2")},
    "p5.48xlarge": {"us-east-1": Price(55.04, _VANTAGE_2026_01, "2026-01-21")},
    "p5en.48xlarge": {"us-east-1": Price(63.296, _VANTAGE_2026_01, "2026-01-21")},
    "g5.xlarge": {"us-east-1": Price(1.006, _VANTAGE_2026_01, "2026-01-21")},
    "g5.12xlarge": {"us-east-1": Price(5.672, _VANTAGE_2026_01, "2026-01-21")},
    "g5.48xlarge": {"us-east-1": Price(16.288, _VANTAGE_2026_01, "2026-01-21")},
    "g6.xlarge": {"us-east-1": Price(0.8048, _VANTAGE_2026_01, "2026-01-21")},
    "g6.12xlarge": {"us-east-1": Price(4.6016, _VANTAGE_2026_01, "2026-01-21")},
    "g6e.xlarge": {"us-east-1": Price(1.861, _VANTAGE_2026_01, "2026-01-21")},
    "g6e.12xlarge": {"us-east-1": Price(10.49264, _VANTAGE_2026_01, "2026-01-21")},
}
# instance type -> region -> spot price per instance-hour; none recorded (see the module docstring).
SPOT_PRICES: dict[str, dict[str, Price]] = {}

_EKS_PRICING = "https://aws.amazon.com/blogs/containers/amazon-eks-extended-support-for-kubernetes-versions-pricing/"
# Per cluster-hour, by the support its Kubernetes version is in.
EKS_CONTROL_PLANE: dict[str, Price] = {
    "standard": Price(0.10, _EKS_PRICING, "2026-12-01"),
    "extended": Price(0.60, _EKS_PRICING, "2026-12-01"),
}
# Kubernetes version -> the last day of its EKS standard support; extended support follows for 12 months
# (https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html). Dates: the EKS version calendar as
# aws-samples/sample-apex-skills (skills/eks-operation-review/references/cluster-lifecycle.md) records it,
# verified 2026-04-24; `llmfleet preflight` asks EKS itself (DescribeClusterVersions).
EKS_STANDARD_SUPPORT_ENDS: dict[str, str] = {
    "1.31": "2025-11-26",
    "1.32": "2026-03-23",
    "1.33": "2026-07-29",
    "1.34": "2026-12-02",
    "1.35": "2027-03-27",
}
_VPC_PRICING = "https://aws.amazon.com/vpc/pricing/ (us-east-1)"
# Per NAT gateway-hour, and per GB it processes (image layers and weights pulled from outside the VPC).
NAT_GATEWAY: dict[str, Price] = {
    "hour": Price(0.045, _VPC_PRICING, "2026-12-01"),
    "gb": Price(0.045, _VPC_PRICING, "2026-12-01", unit="GB"),
}
# An S3 gateway endpoint has no charge (https://docs.aws.amazon.com/vpc/latest/privatelink/vpc-endpoints-s3.html);
# an interface endpoint is billed per zone-hour and per GB (first PB a month; https://aws.amazon.com/privatelink/pricing/).
VPC_ENDPOINTS: dict[str, Price] = {
    "s3-gateway-hour": Price(
        0.0, "https://docs.aws.amazon.com/vpc/latest/privatelink/vpc-endpoints-s3.html", "2026-12-01"
    ),
    "interface-zone-hour": Price(0.01, "https://aws.amazon.com/privatelink/pricing/", "2026-12-01"),
    "interface-gb": Price(0.01, "https://aws.amazon.com/privatelink/pricing/", "2026-12-01", unit="GB"),
}


def _per_gpu(instance: str, gpus: int) -> float:
    """The us-east-1 on-demand price of ``instance`` per GPU-hour: a GPU's price where no instance is named."""
    return ON_DEMAND_PRICES[instance]["us-east-1"].usd / gpus


@dataclass(frozen=True)
class GpuType:
    """One GPU model: memory, peak HBM bandwidth and peak dense BF16 tensor throughput."""

    name: str
    memory_gib: float
    bandwidth_bytes_s: float
    bf16_flops: float
    hour_usd: float  # per GPU-hour where no instance type is named (an existing cluster's GPUs); `_per_gpu`
    nvidia_product: str  # the node label value nvidia's GPU feature discovery would publish


@dataclass(frozen=True)
class InstanceType:
    """One cloud instance type offering GPUs."""

    name: str
    gpu: str
    gpu_count: int
    vcpus: int
    memory_gib: int
    nvme_gib: int


@dataclass(frozen=True)
class ModelFacts:
    """What the memory and step-time math needs to know about a model."""

    parameters: float  # total, including embeddings and the LM head
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    max_position: int
    dtype: str = "bfloat16"

    @property
    def embedding_parameters(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def head_parameters(self) -> float:
        """LM-head parameters read on every step (the embedding matrix again when tied)."""
        return self.embedding_parameters

    @property
    def linear_parameters(self) -> float:
        """Parameters of the per-token linear layers (attention projections and MLP)."""
        untied_head = 0.0 if self.tied_embeddings else self.head_parameters
        return self.parameters - self.embedding_parameters - untied_head


GPUS: dict[str, GpuType] = {
    g.name: g
    for g in (
        GpuType("a100-40gb", 40, 1.555e12, 312e12, _per_gpu("p4d.24xlarge", 8), "NVIDIA-A100-SXM4-40GB"),
        GpuType("a100-80gb", 80, 2.039e12, 312e12, _per_gpu("p4de.24xlarge", 8), "NVIDIA-A100-SXM4-80GB"),
        GpuType("h100-80gb", 80, 3.35e12, 989e12, _per_gpu("p5.48xlarge", 8), "NVIDIA-H100-80GB-HBM3"),
        # p5e (H200) has no on-demand price; p5en carries the same 8 x H200.
        GpuType("h200-141gb", 141, 4.8e12, 989e12, _per_gpu("p5en.48xlarge", 8), "NVIDIA-H200"),
        GpuType("a10g-24gb", 24, 0.6e12, 70e12, _per_gpu("g5.xlarge", 1), "NVIDIA-A10G"),
        GpuType("l4-24gb", 24, 0.3e12, 121e12, _per_gpu("g6.xlarge", 1), "NVIDIA-L4"),
        GpuType("l40s-48gb", 48, 0.864e12, 362e12, _per_gpu("g6e.xlarge", 1), "NVIDIA-L40S"),
        # A deliberately slow profile so a laptop demo shows queueing at a handful of requests.
        GpuType("cpu-demo", 16, 0.05e12, 2e12, 0.0, "none"),
        # vLLM's CPU build on the project's two-core, 24 GiB machines: the simulator plays that build under it
        # (`engine_sim.platform`: 128-token blocks, no sleep mode, step times measured there, not this roofline).
        GpuType("cpu-tiny", 24, 0.05e12, 2e12, 0.0, "none"),
    )
}

# The GPUS entries that stand for vLLM's CPU build, not a GPU: a simulator on one plays that build
# (`engine_sim.platform`), and an agent launching it leaves out the flags the build refuses (`agent.launchers.sim`).
CPU_BUILD_GPUS = frozenset({"cpu-tiny"})

INSTANCES: dict[str, InstanceType] = {
    i.name: i
    for i in (
        InstanceType("p4d.24xlarge", "a100-40gb", 8, 96, 1152, 8000),
        InstanceType("p4de.24xlarge", "a100-80gb", 8, 96, 1152, 8000),
        InstanceType("p5.48xlarge", "h100-80gb", 8, 192, 2048, 30400),
        InstanceType("p5e.48xlarge", "h200-141gb", 8, 192, 2048, 30400),
        InstanceType("g5.xlarge", "a10g-24gb", 1, 4, 16, 250),
        InstanceType("g5.12xlarge", "a10g-24gb", 4, 48, 192, 3800),
        InstanceType("g5.48xlarge", "a10g-24gb", 8, 192, 768, 7600),
        InstanceType("g6.xlarge", "l4-24gb", 1, 4, 16, 250),
        InstanceType("g6.12xlarge", "l4-24gb", 4, 48, 192, 3760),
        InstanceType("g6e.xlarge", "l40s-48gb", 1, 4, 32, 250),
        InstanceType("g6e.12xlarge", "l40s-48gb", 4, 48, 384, 3800),
    )
}

MODELS: dict[str, ModelFacts] = {
    # Qwen2.5-7B-Instruct config.json: 28 layers, hidden 3584, 4 KV heads of 128, vocab 152064, untied.
    "Qwen/Qwen2.5-7B-Instruct": ModelFacts(
        parameters=7.61e9,
        layers=28,
        hidden_size=3584,
        kv_heads=4,
        head_dim=128,
        vocab_size=152064,
        tied_embeddings=False,
        max_position=32768,
    ),
    "meta-llama/Llama-3.1-8B-Instruct": ModelFacts(
        parameters=8.03e9,
        layers=32,
        hidden_size=4096,
        kv_heads=8,
        head_dim=128,
        vocab_size=128256,
        tied_embeddings=False,
        max_position=131072,
    ),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelFacts(
        parameters=0.494e9,
        layers=24,
        hidden_size=896,
        kv_heads=2,
        head_dim=64,
        vocab_size=151936,
        tied_embeddings=True,
        max_position=32768,
    ),
}


def instance_hour_usd(instance: str, region: str, capacity_type: str = "on-demand") -> Price | None:
    """The price of one ``instance``-hour in ``region``: its spot price for spot when one is recorded, else its
    on-demand price (the ceiling of a spot request, and the stand-in for a capacity block); None: not priced."""
    if capacity_type == "spot" and (spot := SPOT_PRICES.get(instance, {}).get(region)) is not None:
        return spot
    return ON_DEMAND_PRICES.get(instance, {}).get(region)


@functools.cache
def ec2_instance_types() -> frozenset[str]:
    """Every EC2 instance type name, from the EC2 API model botocore ships (read once, ~0.3 s)."""
    from botocore.loaders import Loader

    model = Loader().load_service_model("ec2", "service-2")
    return frozenset(model["shapes"]["InstanceType"]["enum"])
