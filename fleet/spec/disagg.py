"""Disaggregation spec: a pool whose prompts may prefill on other engines (``pools[].disaggregation``).

A disaggregated pool has two roles. Its own keys (``engine``, ``replicas``, ``staticReplicas``) describe the
**decode** replicas: every request is answered by one of them, and a short prompt (or one mostly cached there)
is prefilled there too, aggregated. Its ``disaggregation.prefill`` keys describe the **prefill** replicas: a
request whose prompt tokens not cached on the chosen decode replica exceed ``thresholdTokens`` is first sent to
one of them (vLLM's ``kv_transfer_params.do_remote_decode``, ``max_tokens: 1``), and the decode replica pulls the
prompt's KV cache from it over NIXL (`fleet.capacity.disagg.should_disaggregate` decides, for the gateway and the
simulator alike).

The prefill role runs as a pool of its own, ``<pool>-prefill`` (`PoolSpec.prefill_pool`): its agents report
under that name, the control plane scales it within ``prefill.replicas``, gateways route its leg by the same
plugins as the pool's. The facts behind the keys (vLLM 0.33's ``KVTransferConfig`` and NixlConnector) are in
docs/operations.md, "Prefill/decode disaggregation".
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from fleet.spec.base import Spec

__all__ = [
    "DEFAULT_SIDE_CHANNEL_PORT",
    "PREFILL_SUFFIX",
    "DisaggregationSpec",
    "PrefillRoleSpec",
    "RoleReplicasSpec",
    "Backend",
]

PREFILL_SUFFIX = "-prefill"
DEFAULT_SIDE_CHANNEL_PORT = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default (vllm/envs.py)


Backend = Literal["UCX", "LIBFABRIC"]


def _ucx() -> list[Backend]:
    return ["UCX"]


class RoleReplicasSpec(Spec):
    min: int = Field(default=1, ge=0, le=1000)
    """Fewest prefill replicas the autoscaler keeps (0: every prompt prefills on its decode replica)."""
    max: int = Field(default=2, ge=1, le=1000)
    """Most prefill replicas the autoscaler starts."""


class PrefillRoleSpec(Spec):
    """The prefill replicas of a disaggregated pool."""

    replicas: RoleReplicasSpec = Field(default_factory=RoleReplicasSpec)
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=8)
    """GPUs per prefill replica (default: the pool's `engine.tensorParallelSize`). vLLM refuses a prefill TP above
    the decode TP for dense models."""
    version: str | None = None
    """Engine release of the prefill replicas (default: the pool's `engine.version`). NIXL's handshake refuses a
    pair of different vLLM versions, so it must equal the pool's."""
    static_replicas: list[str] = Field(default_factory=list)
    """Prefill engine URLs for a gateway without discovery."""


class DisaggregationSpec(Spec):
    """Prefill on other engines when it pays (see the module docstring)."""

    prefill: PrefillRoleSpec = Field(default_factory=PrefillRoleSpec)
    threshold_tokens: int = Field(default=1000, ge=0, le=1_000_000)
    """A request prefills remotely only when the prompt tokens its decode replica does not cache exceed this
    (older Dynamo's `max_local_prefill_length` default, 1000; llm-d's `nonCachedTokens`). 0: every prompt with an
    uncached token."""
    connector: Literal["NixlConnector"] = "NixlConnector"
    """vLLM's KV connector (`kv_transfer_config.kv_connector`): NIXL's pull mode, the decode replica reading the
    prefill replica's blocks."""
    backends: list[Backend] = Field(default_factory=_ucx, min_length=1)
    """NIXL's transport (`kv_connector_extra_config.backends`): `UCX` (TCP, InfiniBand; on CPU hosts), or
    `LIBFABRIC` for EFA on aws. vLLM supports sleep mode with NIXL only on `[UCX]`."""
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    """What a decode engine does when it cannot load the KV cache (the prefill replica died): `fail` (vLLM's
    default) answers an error, and the gateway then prefills the request on the decode replica itself, before the
    client sees anything; `recompute` makes the engine recompute the prompt silently."""
    side_channel_port: int = Field(default=DEFAULT_SIDE_CHANNEL_PORT, ge=1024, le=65535)
    """NIXL's handshake port on each engine (`VLLM_NIXL_SIDE_CHANNEL_PORT`); the agent takes a free one locally."""

    @field_validator("backends")
    @classmethod
    def _distinct(cls, value: list[Backend]) -> list[Backend]:
        if len(set(value)) != len(value):
            raise ValueError(f"backends must be distinct, got {value}")
        return value
