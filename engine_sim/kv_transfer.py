"""KV transfer config: vLLM 0.33's ``--kv-transfer-config`` and NIXL's side-channel environment, parsed once.

The flag takes one JSON object (``vllm/config/kv_transfer.py`` ``KVTransferConfig``; research file section 1.1)::

    kv_connector               "NixlConnector" (or its 0.33 name "NixlPullConnector"); others are refused here
    kv_role                    "kv_producer" | "kv_consumer" | "kv_both"   required with a connector
    engine_id                  default a random uuid4 string (a restart gets a new one unless pinned)
    kv_buffer_device           default the platform's device: "cuda" on a GPU, "cpu" on the CPU build
    kv_connector_extra_config  {"backends": [...] (default ["UCX"]), "kv_lease_duration": 30, ...}
    kv_load_failure_policy     "fail" (default) | "recompute"
    kv_port, kv_connector_module_path, enable_permute_local_kv: accepted, unused (vLLM's NIXL reads none of them)

What fails at start, as on vLLM: bad JSON or not an object (argparse, exit 2, naming the flag); a connector without a
role, an unknown role, policy or field, an unknown connector ("Unsupported connector type"), a buffer device the
platform's NIXL cannot register, and ``--enable-sleep-mode`` with backends other than ``["UCX"]`` (NIXL's pull
connector supports sleep mode only there). Exit 1 with the message. A registered connector other than NIXL's (e.g.
``ExampleConnector``) is refused too: vLLM would run it, the simulator does not play it.

The role does not change what an engine does (NIXL's usage doc: the proxy decides who prefills): any engine with
the connector answers both legs. The side channel is where vLLM's handshake listener binds and what it returns as
``remote_host``/``remote_port``: ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (default ``localhost``) and
``VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5600, read with ``int()``), as ``vllm/envs.py`` reads them.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine_sim.errors import ConfigError

__all__ = ["FAILURE_POLICIES", "KV_ROLES", "KVTransferSettings", "parse_kv_transfer_config", "settings_from"]

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
FAILURE_POLICIES = ("recompute", "fail")
NIXL_CONNECTORS = ("NixlConnector", "NixlPullConnector")  # 0.33: NixlConnector is the pull connector's old name
OTHER_CONNECTORS = (  # registered in 0.33 (research file 1.2): vLLM runs them, the simulator does not play them
    "ExampleConnector", "ExampleHiddenStatesConnector", "LMCacheConnectorV1", "LMCacheMPConnector",
    "NixlPushConnector", "MultiConnector", "HiSparseConnector", "MoRIIOConnector", "OffloadingConnector",
    "DecodeBenchConnector", "MooncakeConnector", "MooncakeStoreConnector", "FlexKVConnectorV1",
    "SimpleCPUOffloadConnector", "HF3FSKVConnector",
)  # fmt: skip
_FIELDS = frozenset(
    {"kv_connector", "kv_role", "engine_id", "kv_buffer_device", "kv_port", "kv_connector_extra_config",
     "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy"}
)  # fmt: skip
_DEVICES = {"cuda": ("cuda", "cpu"), "cpu": ("cpu",)}  # nixl/utils.py _NIXL_SUPPORTED_DEVICE, by platform device
DEFAULT_LEASE_S = 30.0  # kv_lease_duration: how long a prefill engine holds finished blocks for a decode's pull
DEFAULT_SIDE_CHANNEL_PORT = 5600


def parse_kv_transfer_config(text: str) -> dict[str, Any]:
    """argparse ``type`` of ``--kv-transfer-config``: a JSON object (argparse turns the error into exit 2)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


@dataclass(frozen=True)
class KVTransferSettings:
    """A configured NIXL connector: who this engine is, where its side channel listens, what a failed pull does."""

    engine_id: str
    role: str
    buffer_device: str
    backends: tuple[str, ...]
    lease_s: float  # kv_lease_duration
    failure_policy: str  # "fail" | "recompute"
    side_channel_host: str
    side_channel_port: int

    @property
    def recompute(self) -> bool:
        return self.failure_policy == "recompute"


def settings_from(
    raw: Mapping[str, Any] | None, env: Mapping[str, str], device: str, sleep_mode: bool
) -> KVTransferSettings | None:
    """The flag's object and the environment -> settings (None without a connector); ConfigError as vLLM refuses.
    ``device``: the platform's (``cuda`` or ``cpu``); ``sleep_mode``: ``--enable-sleep-mode`` was given."""
    if raw is None:
        return None
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ConfigError(f"--kv-transfer-config: unknown field(s) {unknown}; valid: {sorted(_FIELDS)}")
    connector, role = raw.get("kv_connector"), raw.get("kv_role")
    if connector is None:
        return None  # vLLM: no connector, no KV transfer (a role alone does nothing)
    if role is None:
        raise ConfigError(f"Please specify kv_role when kv_connector is set, supported roles are {KV_ROLES}")
    if role not in KV_ROLES:
        raise ConfigError(f"Unsupported kv_role: {role}. Supported roles are {KV_ROLES}")
    if connector in OTHER_CONNECTORS:
        raise ConfigError(f"kv_connector {connector!r}: the simulator plays only {list(NIXL_CONNECTORS)}")
    if connector not in NIXL_CONNECTORS:
        raise ConfigError(f"Unsupported connector type: {connector}")
    policy = raw.get("kv_load_failure_policy", "fail")
    if policy not in FAILURE_POLICIES:
        raise ConfigError(f"kv_load_failure_policy must be one of {FAILURE_POLICIES}, got {policy!r}")
    buffer_device = raw.get("kv_buffer_device") or device
    if buffer_device not in _DEVICES.get(device, ()):
        raise ConfigError(f"{device} with {buffer_device} kv_buffer is not supported by NixlConnector")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("--kv-transfer-config: kv_connector_extra_config must be an object")
    backends = extra.get("backends", ["UCX"])
    if not isinstance(backends, list) or not backends or not all(isinstance(b, str) for b in backends):
        raise ConfigError("kv_connector_extra_config.backends must be a non-empty list of backend names")
    if sleep_mode and backends != ["UCX"]:
        raise ConfigError(f"NixlConnector supports sleep mode only with backends ['UCX'], not {backends}")
    lease = extra.get("kv_lease_duration", DEFAULT_LEASE_S)
    if isinstance(lease, bool) or not isinstance(lease, int | float) or lease <= 0:
        raise ConfigError(f"kv_connector_extra_config.kv_lease_duration must be a positive number, got {lease!r}")
    host, port = _side_channel(env)
    return KVTransferSettings(
        engine_id=str(raw.get("engine_id") or uuid.uuid4()),
        role=role,
        buffer_device=buffer_device,
        backends=tuple(backends),
        lease_s=float(lease),
        failure_policy=policy,
        side_channel_host=host,
        side_channel_port=port,
    )


def _side_channel(env: Mapping[str, str]) -> tuple[str, int]:
    """``VLLM_NIXL_SIDE_CHANNEL_HOST`` and ``_PORT`` as vLLM reads them (``int()``; a bad port fails the start)."""
    raw_port = env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", str(DEFAULT_SIDE_CHANNEL_PORT))
    try:
        port = int(raw_port)
    except ValueError:
        raise ConfigError(f"VLLM_NIXL_SIDE_CHANNEL_PORT must be an integer, got {raw_port!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"VLLM_NIXL_SIDE_CHANNEL_PORT out of range: {port}")
    return env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"), port
