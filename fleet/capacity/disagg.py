"""Disaggregation: the per-request prefill/decode decision and the KV transfer's time over a node group's link.

Pure functions the fleet simulator calls today and the gateway's two-leg path (issue 39, item 3) will call: one
decision for both, so what the simulator prices is what the gateway does.

* **Decision** (`should_disaggregate`): a request prefills on a prefill replica only when the prompt tokens the
  chosen decode replica does not already cache *exceed* ``threshold``; shorter ones stay aggregated on the decode
  replica. It is llm-d's ``prefix-based-pd-decider`` (P/D iff ``nonCached >= nonCachedTokens``, decode pod picked
  first) and older Dynamo's ``prefill_remote`` (``prefill_length - prefix_hit_length > max_local_prefill_length``,
  default 1000): ../shared/research/pd_disaggregation.md, sections 2.1 and 2.2.
* **Transfer** (`KvLink`): vLLM's NIXL pull is serial with TTFT (the decode replica waits in
  ``WAITING_FOR_REMOTE_KVS``), so a request's KV costs ``bytes x 8 / link bits per second`` on the prefill
  replica's share of its node's network, plus, the first time a prefill and a decode replica meet, the NIXL
  handshake: llm-d puts it at "~5s" on GPU clusters (research file, section 1.4; run here on CPU it took 0.085 s +
  0.641 s). Bytes are `fleet.capacity.perf.kv_bytes_per_token` x the tokens the decode replica lacks (56 KiB a
  token for Qwen2.5-7B: 448 MiB for 8,192 tokens, research file 4.1).
* **Link** (`EFA_GBPS_PER_NODE`): p4d/p4de carry 4 x 100 Gbit/s EFA per 8 GPUs ("GPUDirect RDMA backed with 4x100
  Gbps EFA", aws-samples/aws-efa-eks), p5/p5e 3.2 Tbit/s (Dynamo's EKS EFA page): research file 4.3. A replica gets
  its GPUs' share of its node's link (a TP1 replica on p4de: 50 Gbit/s). Instances without EFA fall back to
  ``TCP_GBPS``, well above what Dynamo saw NIXL reach over mis-configured UCX ("effectively TCP-speed at ~1-3
  GB/s"), so the price of a missing EFA is understated, not overstated.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.capacity.catalog import INSTANCES

__all__ = [
    "DEFAULT_THRESHOLD_TOKENS",
    "EFA_GBPS_PER_NODE",
    "HANDSHAKE_S",
    "TCP_GBPS",
    "KvLink",
    "link_gbps",
    "should_disaggregate",
]

# Older Dynamo's ``max_local_prefill_length`` default: prompts of up to 1000 uncached tokens prefill locally.
DEFAULT_THRESHOLD_TOKENS = 1000
# llm-d: a first-contact NIXL handshake "~5s" on GPU clusters, once per prefill/decode pair.
HANDSHAKE_S = 5.0
# Gbit/s of EFA per node (all its devices); research file section 4.3.
EFA_GBPS_PER_NODE: dict[str, float] = {
    "p4d.24xlarge": 400.0,
    "p4de.24xlarge": 400.0,
    "p5.48xlarge": 3200.0,
    "p5e.48xlarge": 3200.0,
}
TCP_GBPS = 25.0  # an instance without EFA: its ENA network, the most a TCP transfer could use


def should_disaggregate(uncached_prompt_tokens: int, threshold: int) -> bool:
    """Prefill remotely when the prompt tokens the chosen decode replica lacks exceed ``threshold``."""
    return uncached_prompt_tokens > threshold


def link_gbps(instance_type: str | None, gpus_per_replica: int) -> float:
    """Gbit/s one replica of ``gpus_per_replica`` GPUs on ``instance_type`` can send: its GPUs' share of the node's
    EFA, else ``TCP_GBPS`` (no node group, or no EFA on the instance)."""
    if instance_type is None or instance_type not in EFA_GBPS_PER_NODE:
        return TCP_GBPS
    gpus = INSTANCES[instance_type].gpu_count
    return EFA_GBPS_PER_NODE[instance_type] * min(1.0, gpus_per_replica / gpus)


@dataclass(frozen=True)
class KvLink:
    """A prefill replica's link to decode replicas: ``gbps`` its send rate, ``handshake_s`` a new pair's first
    contact."""

    gbps: float
    handshake_s: float = HANDSHAKE_S

    def wire_seconds(self, nbytes: float) -> float:
        """Seconds the link is busy sending ``nbytes``."""
        return nbytes * 8.0 / (self.gbps * 1e9)

    def transfer_seconds(self, nbytes: float, first_contact: bool) -> float:
        """A request's KV transfer on an idle link: the bytes, plus the handshake on a pair's first contact."""
        return self.wire_seconds(nbytes) + (self.handshake_s if first_contact else 0.0)
