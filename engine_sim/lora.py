"""LoRA: which adapters a simulated replica serves, where each one is (disk, host memory, a GPU slot), and what it
costs to bring one in.

``--enable-lora --lora-modules name=path ...`` registers adapters by name; a request naming one waits until it is
in a GPU slot. vLLM keeps up to ``--max-cpu-loras`` adapters in host memory and ``--max-loras`` on the GPU, each an
LRU: an adapter on neither is read from disk (`fleet.capacity.lora.disk_load_seconds`), one in host memory is copied to
the
GPU (`fleet.capacity.lora.swap_in_seconds`), one on the GPU costs nothing. A request for an adapter already being loaded
waits for that load rather than starting another. The wait counts in the request's TTFT, as in vLLM, where the
load happens in the engine's step.

Not modelled: vLLM's limit of ``--max-loras`` distinct adapters in one batch (requests beyond it wait a step) and
the per-token cost of the LoRA matmuls; an adapter's rank is read from its ``adapter_config.json`` when ``path``
is a local directory, else taken as ``--max-lora-rank``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine_sim.errors import ConfigError
from fleet.capacity.catalog import ModelFacts
from fleet.capacity.lora import VALID_RANKS, disk_load_seconds, swap_in_seconds

__all__ = ["AdapterResidency", "LoraSettings", "parse_lora_modules"]


@dataclass(frozen=True)
class LoraSettings:
    modules: tuple[tuple[str, str, int], ...]  # (name, path, rank)
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.modules)

    def path(self, name: str) -> str:
        return next(path for n, path, _ in self.modules if n == name)


def _rank(path: str, default: int) -> int:
    config = Path(path) / "adapter_config.json"
    try:
        rank = json.loads(config.read_text()).get("r", default)
    except (OSError, ValueError):
        return default
    return rank if isinstance(rank, int) and rank > 0 else default


def parse_lora_modules(
    values: Sequence[str], max_loras: int, max_lora_rank: int, max_cpu_loras: int | None
) -> LoraSettings:
    """``name=path`` or vLLM's JSON form ``{"name": ..., "path": ...}``; ConfigError as vLLM refuses them."""
    if max_lora_rank not in VALID_RANKS:
        raise ConfigError(f"--max-lora-rank {max_lora_rank}: must be one of {list(VALID_RANKS)}")
    if max_loras < 1:
        raise ConfigError("--max-loras must be >= 1")
    if max_cpu_loras is not None and max_cpu_loras < max_loras:
        raise ConfigError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})")
    modules = []
    for value in values:
        if value.lstrip().startswith("{"):
            try:
                item = json.loads(value)
                name, path = str(item["name"]), str(item["path"])
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"--lora-modules {value!r}: JSON needs 'name' and 'path'") from None
        else:
            name, sep, path = value.partition("=")
            if not sep or not name or not path:
                raise ConfigError(f"--lora-modules {value!r}: expected name=path or JSON")
        rank = _rank(path, max_lora_rank)
        if rank > max_lora_rank:
            raise ConfigError(f"LoRA rank {rank} of {name!r} is greater than max_lora_rank {max_lora_rank}")
        modules.append((name, path, rank))
    names = [m[0] for m in modules]
    if len(set(names)) != len(names):
        raise ConfigError(f"--lora-modules: duplicate names in {names}")
    return LoraSettings(tuple(modules), max_loras, max_lora_rank, max_cpu_loras)


class AdapterResidency:
    """Where each adapter is, in model time; `ready_in` charges the cost of bringing one in and records it."""

    def __init__(self, settings: LoraSettings, facts: ModelFacts) -> None:
        self.settings = settings
        self._rank = {name: rank for name, _, rank in settings.modules}
        self._facts = facts
        self._gpu: OrderedDict[str, float] = OrderedDict()  # name -> model time it is usable from
        self._cpu: OrderedDict[str, None] = OrderedDict()
        self.loads_from_disk = 0
        self.swaps_in = 0

    @property
    def on_gpu(self) -> tuple[str, ...]:
        return tuple(self._gpu)

    def ready_in(self, name: str, now: float) -> float:
        """Model seconds until ``name`` is usable for a request arriving at ``now`` (0 when already on the GPU)."""
        ready_at = self._gpu.get(name)
        if ready_at is not None:
            # Both LRUs see every use, so the GPU's adapters are the host cache's most recent: evicting the host
            # cache's oldest never drops one still on the GPU (max_cpu_loras >= max_loras).
            self._gpu.move_to_end(name)
            self._cpu.move_to_end(name)
            return max(0.0, ready_at - now)
        rank = self._rank[name]
        cost = swap_in_seconds(self._facts, rank)
        if name in self._cpu:
            self._cpu.move_to_end(name)
            self.swaps_in += 1
        else:
            cost += disk_load_seconds(self._facts, rank)
            self.loads_from_disk += 1
            self._cpu[name] = None
            cpu_cap = self.settings.max_cpu_loras or self.settings.max_loras
            while len(self._cpu) > cpu_cap:
                self._cpu.popitem(last=False)
        self._gpu[name] = now + cost
        while len(self._gpu) > self.settings.max_loras:
            self._gpu.popitem(last=False)
        return cost
