"""Validate disaggregation: what vLLM refuses of a prefill/decode pair, refused before an engine starts.

Part of `fleet.spec.validate.check_spec`, for each pool with ``disaggregation`` (`fleet.spec.disagg`). vLLM 0.33's
facts (../shared/research/pd_disaggregation.md, section 1.3): NIXL's handshake compares a compatibility hash that
includes the vLLM version, so both roles run one release; a prefill TP above the decode TP fails the handshake's
check for dense models (`_validate_remote_agent_handshake`); NixlConnector supports sleep mode only in pull mode
with ``backends == ["UCX"]``. The derived ``<pool>-prefill`` name must be free and a valid pool name.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleet.capacity.disagg import EFA_GBPS_PER_NODE
from fleet.spec.errors import Problem, key_error as _err, key_warning as _warn
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["check_disaggregation"]

_MAX_NAME = 42  # fleet.spec.base's pool name pattern: a DNS label of at most 42 characters


def check_disaggregation(spec: FleetSpec) -> Iterator[Problem]:
    names = {p.name for p in spec.pools}
    for index, pool in enumerate(spec.pools):
        if pool.disaggregation is not None:
            yield from _pool(spec, f"pools[{index}].disaggregation", pool, names)


def _pool(spec: FleetSpec, path: str, pool: PoolSpec, names: set[str]) -> Iterator[Problem]:
    pd = pool.disaggregation
    assert pd is not None
    prefill = pool.prefill_pool()
    assert prefill is not None
    if prefill.name in names or len(prefill.name) > _MAX_NAME:
        why = "another pool has that name" if prefill.name in names else f"longer than {_MAX_NAME} characters"
        yield _err(
            f"{path}",
            f"its prefill replicas run as pool {prefill.name!r}, which cannot be: {why}; rename the pool",
        )
    if pool.engine.runner != "generate":
        yield _err(f"{path}", "only a generative pool (engine.runner: generate) prefills apart", pool.engine.runner)
    p_tp, d_tp = prefill.engine.tensor_parallel_size, pool.engine.tensor_parallel_size
    if p_tp > d_tp:
        yield _err(
            f"{path}.prefill.tensorParallelSize",
            f"vLLM refuses a prefill tensor parallelism above the decode one for dense models; allowed: at most "
            f"engine.tensorParallelSize ({d_tp})",
            p_tp,
        )
    if prefill.engine.version != pool.engine.version:
        yield _err(
            f"{path}.prefill.version",
            f"NIXL's handshake refuses engines of different vLLM versions; allowed: the pool's engine.version "
            f"({pool.engine.version!r}) or unset",
            prefill.engine.version,
        )
    if pool.engine.sleep_mode and pd.backends != ["UCX"]:
        yield _err(
            f"{path}.backends",
            "vLLM supports sleep mode with NixlConnector only on backends [UCX]; allowed: [UCX], or "
            "engine.sleepMode: false",
            pd.backends,
        )
    if pool.adapters:
        yield _err(f"{path}", "LoRA adapters are not prefilled apart here; allowed: a pool without adapters")
    if pool.node_group is not None and spec.target == "aws":
        instance = spec.node_group(pool.node_group).instance_type
        # The instance types llmfleet runs EFA on (infra.efa gives their pods devices, the simulator their link).
        if instance not in EFA_GBPS_PER_NODE:
            yield _warn(
                f"{path}",
                f"node group {pool.node_group!r} runs {instance}, on which llmfleet runs no EFA (the types it does: "
                f"{', '.join(sorted(EFA_GBPS_PER_NODE))}): the KV cache would cross TCP, which Dynamo measured at "
                "about 100 times the TTFT of EFA (docs/operations.md)",
            )
        elif "LIBFABRIC" not in pd.backends:
            yield _warn(f"{path}.backends", f"{instance} carries EFA: NIXL reaches it through [LIBFABRIC], not UCX")
    if pd.prefill.replicas.min > pd.prefill.replicas.max:
        yield _err(
            f"{path}.prefill.replicas.min",
            f"must be <= prefill.replicas.max ({pd.prefill.replicas.max})",
            pd.prefill.replicas.min,
        )
