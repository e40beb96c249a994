"""LoRA: the memory and load-time arithmetic of serving adapters on a base model, shared by the plan and the simulator.

vLLM (``--enable-lora``) reserves, at start-up, GPU memory for ``--max-loras`` adapter *slots* of rank
``--max-lora-rank`` on every linear layer of every decoder layer: for a ``d_in x d_out`` projection, A is
``d_in x r`` and B is ``r x d_out``, so a slot costs ``r x (d_in + d_out)`` elements per projection. That memory is
taken before the KV cache is sized, so each slot costs KV tokens.

The projections of a Llama/Qwen-style decoder layer: q and o (``h -> h``), k and v (``h -> kv``, kv = KV heads x
head dim), gate and up (``h -> I``) and down (``I -> h``). The catalogue has no MLP width ``I``; it follows from the
per-layer linear parameters ``P = 2h^2 + 2h*kv + 3h*I``.

Loading an adapter that is not in the engine's CPU cache reads its weights (``rank x sum(d_in + d_out) x layers``
elements at the adapter's rank) from the node's disk: ``adapter_bytes / DISK_BYTES_PER_S`` plus a fixed setup
cost. Moving one from the CPU cache into a free GPU slot costs ``adapter_bytes / PCIE_BYTES_PER_S``.
"""

from __future__ import annotations

from fleet.capacity.catalog import DTYPE_BYTES, ModelFacts

__all__ = [
    "DISK_BYTES_PER_S",
    "LOAD_SETUP_S",
    "PCIE_BYTES_PER_S",
    "VALID_RANKS",
    "adapter_bytes",
    "disk_load_seconds",
    "lora_slot_bytes",
    "projection_width_sum",
    "swap_in_seconds",
]

# The ranks vLLM 0.33 accepts for --max-lora-rank.
VALID_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DISK_BYTES_PER_S = 2e9  # a node's local NVMe, as the model cache uses
PCIE_BYTES_PER_S = 20e9  # host to GPU, PCIe 4.0 x16 in practice
LOAD_SETUP_S = 0.02  # reading the adapter config, building the tensors' metadata


def projection_width_sum(model: ModelFacts) -> float:
    """Sum of ``d_in + d_out`` over one decoder layer's seven projections."""
    h = model.hidden_size
    kv = model.kv_heads * model.head_dim
    per_layer = model.linear_parameters / model.layers
    mlp_width = max(0.0, (per_layer - 2 * h * h - 2 * h * kv) / (3 * h))
    return 2 * (h + h) + 2 * (h + kv) + 2 * (h + mlp_width) + (mlp_width + h)


def adapter_bytes(model: ModelFacts, rank: int) -> float:
    """Weights of one adapter of ``rank`` on every projection of every layer, in the model's dtype."""
    return rank * projection_width_sum(model) * model.layers * DTYPE_BYTES[model.dtype]


def lora_slot_bytes(model: ModelFacts, max_loras: int, max_lora_rank: int) -> float:
    """GPU memory one replica reserves for ``max_loras`` slots of ``max_lora_rank``, over all its GPUs (tensor
    parallelism shards the slots as it shards the weights)."""
    return max_loras * adapter_bytes(model, max_lora_rank)


def disk_load_seconds(model: ModelFacts, rank: int) -> float:
    return LOAD_SETUP_S + adapter_bytes(model, rank) / DISK_BYTES_PER_S


def swap_in_seconds(model: ModelFacts, rank: int) -> float:
    return adapter_bytes(model, rank) / PCIE_BYTES_PER_S
