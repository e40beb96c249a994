"""KV transfer: the ``--kv-transfer-config`` flag and environment of a prefill or decode engine (P/D pools).

A pool with ``disaggregation`` runs two roles (`fleet.spec.disagg`): its own replicas decode, its ``<pool>-prefill``
role pool's replicas prefill. Each role's engine gets vLLM 0.33's ``KVTransferConfig`` as JSON
(``vllm/config/kv_transfer.py``; docs/agent.md, "A prefill or decode pool")::

    {"kv_connector": "NixlConnector", "kv_role": "kv_producer",        # prefill; kv_consumer for decode
     "kv_buffer_device": "cpu",                                        # only for an engine on a CPU
     "kv_connector_extra_config": {"backends": ["UCX"]},
     "kv_load_failure_policy": "fail"}

* ``kv_role``: NixlConnector logs ``kv_both`` as deprecated and asks for ``kv_producer`` on prefill instances and
  ``kv_consumer`` on decode ones (``nixl/connector.py:97-103``).
* ``kv_buffer_device``: vLLM's default is the platform's device (``cuda`` on a GPU), so it is left out there; on the
  CPU build NIXL registers host memory and the probe that ran the two legs on CPU engines gave ``cpu``.
* ``kv_load_failure_policy``: read by the decode engine (what it does when it cannot pull the prompt's KV cache);
  a prefill engine carries it too, so both roles of a pool show the same config.

The environment names NIXL's side channel, the ZMQ listener a decode engine's handshake reaches before it reads the
prefill engine's blocks: ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (vLLM's default ``localhost``; vLLM returns it verbatim to
the proxy as ``remote_host``, so it must be the address others reach the pod at) and ``VLLM_NIXL_SIDE_CHANNEL_PORT``
(default 5600; two engines on one host need two ports). The agent decides both (`SideChannel`, ``agent.cli``).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from fleet.spec.stack import PoolSpec

__all__ = [
    "KV_ROLES",
    "KV_TRANSFER_FLAG",
    "LOOPBACK_UCX_ENV",
    "SIDE_CHANNEL_HOST_ENV",
    "SIDE_CHANNEL_PORT_ENV",
    "SideChannel",
    "kv_transfer_config",
    "kv_transfer_env",
    "kv_transfer_flags",
]

KV_TRANSFER_FLAG = "--kv-transfer-config"
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}  # PoolSpec.role -> KVTransferConfig.kv_role

# UCX on a CPU host whose two engines talk over loopback: the one UCX setting under which vLLM's two legs have run
# on CPU engines here (../shared/research/pd_disaggregation.md, sections 1.5 and 1.7; and two agents' engines on
# local-vllm-pd). Unset, UCX picks among every transport and interface it finds, a combination never run with the
# CPU build; on a cluster loopback is wrong (the engines are on different hosts), so this is set only for a side
# channel on a loopback address.
LOOPBACK_UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}


@dataclass(frozen=True)
class SideChannel:
    """Where an engine's NIXL handshake listener is reached: the pod's address and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def kv_transfer_config(pool: PoolSpec, cpu: bool) -> dict[str, Any] | None:
    """The ``--kv-transfer-config`` value of ``pool``'s engines (``cpu``: the engine runs on a CPU); None for an
    aggregated pool."""
    pd = pool.disaggregation
    if pd is None or pool.role == "aggregated":
        return None
    config: dict[str, Any] = {"kv_connector": pd.connector, "kv_role": KV_ROLES[pool.role]}
    if cpu:
        config["kv_buffer_device"] = "cpu"
    config["kv_connector_extra_config"] = {"backends": list(pd.backends)}
    config["kv_load_failure_policy"] = pd.kv_load_failure_policy
    return config


def kv_transfer_flags(pool: PoolSpec, cpu: bool) -> list[str]:
    """``--kv-transfer-config`` and its compact JSON, or nothing for an aggregated pool."""
    config = kv_transfer_config(pool, cpu)
    return [] if config is None else [KV_TRANSFER_FLAG, json.dumps(config, separators=(",", ":"))]


def kv_transfer_env(pool: PoolSpec, cpu: bool, side_channel: SideChannel | None, own: dict[str, str]) -> dict[str, str]:
    """The variables ``pool``'s engine gets beside the agent's own (``own``, which win for UCX's): the side channel,
    and on a CPU over loopback with the UCX backend `LOOPBACK_UCX_ENV`. Nothing for an aggregated pool or without a
    side channel (vLLM's defaults then)."""
    pd = pool.disaggregation
    if pd is None or pool.role == "aggregated" or side_channel is None:
        return {}
    env = {SIDE_CHANNEL_HOST_ENV: side_channel.host, SIDE_CHANNEL_PORT_ENV: str(side_channel.port)}
    if cpu and pd.backends == ["UCX"] and side_channel.loopback:
        env.update({k: v for k, v in LOOPBACK_UCX_ENV.items() if not own.get(k)})
    return env
