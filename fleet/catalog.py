"""Catalogue: built-in facts about GPUs, GPU instances and models used by the memory and capacity math.

Figures are public vendor specifications (memory, HBM bandwidth, dense BF16 tensor throughput) and the
models' published configs. Efficiency factors turning peaks into achievable rates live in `fleet.perf`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["DTYPE_BYTES", "GPUS", "INSTANCES", "MODELS", "GpuType", "InstanceType", "ModelFacts", "ec2_instance_types"]

GIB = 1024**3

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "fp8": 1, "float32": 4, "auto": 2}


@dataclass(frozen=True)
class GpuType:
    """One GPU model: memory, peak HBM bandwidth and peak dense BF16 tensor throughput."""

    name: str
    memory_gib: float
    bandwidth_bytes_s: float
    bf16_flops: float
    hour_usd: float  # default on-demand price per GPU-hour; a stack may override it
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
        GpuType("a100-40gb", 40, 1.555e12, 312e12, 2.0, "NVIDIA-A100-SXM4-40GB"),
        GpuType("a100-80gb", 80, 2.039e12, 312e12, 2.5, "NVIDIA-A100-SXM4-80GB"),
        GpuType("h100-80gb", 80, 3.35e12, 989e12, 4.5, "NVIDIA-H100-80GB-HBM3"),
        GpuType("h200-141gb", 141, 4.8e12, 989e12, 5.5, "NVIDIA-H200"),
        GpuType("a10g-24gb", 24, 0.6e12, 70e12, 1.0, "NVIDIA-A10G"),
        GpuType("l4-24gb", 24, 0.3e12, 121e12, 0.8, "NVIDIA-L4"),
        GpuType("l40s-48gb", 48, 0.864e12, 362e12, 1.9, "NVIDIA-L40S"),
        # A deliberately slow profile so a laptop demo shows queueing at a handful of requests.
        GpuType("cpu-demo", 16, 0.05e12, 2e12, 0.0, "none"),
    )
}

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


@functools.cache
def ec2_instance_types() -> frozenset[str]:
    """Every EC2 instance type name, from the EC2 API model botocore ships (read once, ~0.3 s)."""
    from botocore.loaders import Loader

    model = Loader().load_service_model("ec2", "service-2")
    return frozenset(model["shapes"]["InstanceType"]["enum"])
