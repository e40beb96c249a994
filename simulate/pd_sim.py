"""PdSim: a pool split into prefill and decode replicas (prefill/decode disaggregation), priced in virtual time.

`simulate.fleet_sim.FleetSim`'s pool, router, gateway queue and billing, with ``prefill`` more replicas of the same
engine that only prefill. The gateway routes each request to a *decode* replica first (the pool's router over the
decode replicas, as llm-d's decode-first profile); the tokens of its prompt that replica's prefix cache lacks
decide (`fleet.capacity.disagg.should_disaggregate`, the function the gateway's two-leg path will call):

* at most ``threshold``: the request stays aggregated on the decode replica, as in `FleetSim`;
* more: vLLM's prefill leg (the same request with ``max_tokens`` 1) runs on the prefill replica with the least
  queued prefill; when it finishes, the KV of the tokens the decode replica lacks crosses the prefill replica's
  link (`fleet.capacity.disagg.KvLink`: bytes at the replica's share of its node's EFA, one transfer at a time per
  prefill replica, plus the handshake on a pair's first contact), lands in the decode replica's prefix cache, and
  the decode leg is admitted there: it finds the prompt's full blocks cached and computes the last partial block
  (vLLM's decode engine likewise computes what the remote blocks do not hold) and decodes. Where the decode
  replica has no free block for the KV when it lands, it recomputes the prompt (vLLM's ``recompute`` policy),
  counted in ``recomputed``.

Prefill replicas run prefill-only steps (each request finishes at its first token), so long prompts never share a
step with a decode: the decode replicas' inter-token latency stays steady. They are billed like decode replicas
(same engine, same node group). With ``prefill == 0`` this is the aggregated pool, measured the same way.

Per request it records TTFT (arrival to the first token of the decode leg, gateway queue, prefill leg and transfer
included) and TPOT (the decode leg's mean time between tokens), for goodput against both targets (`simulate.pd`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_sim.request import SimRequest
from fleet.capacity.disagg import KvLink, should_disaggregate
from fleet.capacity.perf import kv_bytes_per_token
from fleet.protocol.wire import ReplicaState
from fleet.spec.stack import FleetSpec, PoolSpec
from gateway.routing.base import Router
from simulate.fleet_sim import FleetSim
from simulate.kv_oracle import cached_prefix_blocks, prefix_cache_keys
from simulate.kvpool import build_replica_scheduler, replica_config
from simulate.prompts import prompt_tokens, request_info
from simulate.replica import Replica
from simulate.result import Result
from simulate.trace import TraceRequest

__all__ = ["PdResult", "PdSim"]


@dataclass
class PdResult(Result):
    prefill_replicas: int = 0
    disaggregated: int = 0  # requests prefilled on a prefill replica
    handshakes: int = 0  # first contacts between a prefill and a decode replica
    recomputed: int = 0  # KV landed on a decode replica with no free block: it recomputed the prompt
    transfer_bytes: float = 0.0
    transfer_s: array[float] = field(default_factory=lambda: array("d"))  # per transfer: queue + handshake + wire
    # per request that finished: (TTFT from its arrival, mean seconds per output token after the first)
    per_request: list[tuple[float, float]] = field(default_factory=list)


class PdSim(FleetSim):
    """`FleetSim` with ``prefill`` prefill-only replicas beside the pool's decode replicas (module docstring)."""

    def __init__(
        self,
        spec: FleetSpec,
        pool: PoolSpec,
        router: Router,
        trace: Sequence[TraceRequest],
        *,
        decode: int,
        prefill: int,
        threshold: int,
        link: KvLink,
        name: str = "",
        floor_rids: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(spec, pool, router, None, trace, name=name, initial_replicas=decode, floor_rids=floor_rids)
        self.result: PdResult = PdResult(name, prefill_replicas=prefill)
        self.result.gpus_per_replica = pool.engine.tensor_parallel_size
        self.threshold, self.link = threshold, link
        self.kv_per_token = kv_bytes_per_token(self.engine_config.facts)
        prefill_config = replica_config(spec, pool)  # records no KV events: the gateway's index is the decode pool's
        self.prefill = [
            Replica(f"{pool.name}-prefill-{i}", build_replica_scheduler(prefill_config), 0.0, ReplicaState.READY)
            for i in range(prefill)
        ]
        self.prefill_names = frozenset(r.name for r in self.prefill)
        self.link_free: dict[str, float] = {r.name: 0.0 for r in self.prefill}
        self.met: set[tuple[str, str]] = set()
        # per request on its way: (decode leg, its decode replica, tokens that replica held when routed)
        self.legs: dict[str, tuple[SimRequest, Replica, int]] = {}
        self.sent_at: dict[str, float] = {}
        self.decode_legs: list[tuple[float, SimRequest]] = []
        self.billed_since = (0.0, decode + prefill, 0)

    def begin(self) -> None:
        super().begin()
        self.handlers["kv-landed"] = self.on_kv_landed

    def live(self) -> list[Replica]:
        """Decode and prefill replicas: both are billed."""
        return [*super().live(), *self.prefill]

    def dispatch(self, now: float, item: tuple[int, TraceRequest]) -> None:
        """Route to a decode replica, then decide: aggregated there, or a prefill leg first."""
        index, a = item
        seqs = self.pool.engine.max_num_seqs
        views = [r.view(self.pool.name, self.model, seqs, now) for r in self.replicas if r.state == ReplicaState.READY]
        tokens = prompt_tokens(a, index)
        decision = self.router.route(views, request_info(a, tokens, self.model, now))
        if decision is None:
            self.result.unrouted += 1
            return
        self.traffic.admitted += 1
        self.gw_in_flight += 1
        decode = self.by_name[decision.endpoint.id]
        request = SimRequest(a.rid, tokens, max_tokens=a.output_tokens, cache_salt=a.cache_salt)
        self.decode_legs.append((a.t, request))
        if not self.prefill:
            decode.sent(a.rid, len(tokens), decision.spared)
            self.admit(decode, request, now)
            return
        keys = prefix_cache_keys(tokens, decode.scheduler.kv.block_size, a.cache_salt)
        held = cached_prefix_blocks(decode.scheduler, keys, len(tokens)) * decode.scheduler.kv.block_size
        if not should_disaggregate(len(tokens) - held, self.threshold):
            decode.sent(a.rid, len(tokens), decision.spared)
            self.admit(decode, request, now)
            return
        decode.sent(a.rid, len(tokens), 1.0)  # the gateway expects it to prefill nothing
        prefiller = min(self.prefill, key=lambda r: (r.prefill_tokens, r.in_flight, r.name))
        prefiller.sent(a.rid, len(tokens), 0.0)
        self.legs[a.rid] = (request, decode, held)
        self.result.disaggregated += 1
        leg = SimRequest(a.rid, list(tokens), max_tokens=1, cache_salt=a.cache_salt)
        self.admit(prefiller, leg, now)

    def admit(self, replica: Replica, request: SimRequest, now: float) -> None:
        if replica.scheduler.in_run:  # the step running now is the run's last: the next one may admit this request
            replica.run_seq += 1
            self.push(replica.scheduler.truncate_decode_run(now), "run", (replica, replica.run_seq))
        replica.scheduler.add(request, now)
        self.kick(replica, now)

    def on_step(self, now: float, r: Replica) -> None:
        if r.name not in self.prefill_names:
            super().on_step(now, r)
            return
        assert r.plan is not None
        result = r.scheduler.complete(r.plan)
        r.plan = None
        for ev in result.events:  # every prefill leg ends at its first token
            r.finished(ev.request.request_id)
            self.transfer(now, r, ev.request.request_id)
        self.kick(r, now)

    def transfer(self, now: float, prefiller: Replica, rid: str) -> None:
        """Send the KV the decode replica lacks over ``prefiller``'s link, after other transfers on it."""
        request, decode, held = self.legs[rid]
        nbytes = (request.num_prompt_tokens - held) * self.kv_per_token
        pair = (prefiller.name, decode.name)
        handshake = self.link.handshake_s if pair not in self.met else 0.0
        self.met.add(pair)
        self.result.handshakes += handshake > 0
        start = max(now + handshake, self.link_free[prefiller.name])
        landed = start + self.link.wire_seconds(nbytes)
        self.link_free[prefiller.name] = landed
        self.result.transfer_bytes += nbytes
        self.result.transfer_s.append(landed - now)
        self.push(landed, "kv-landed", rid)

    def on_kv_landed(self, now: float, rid: str) -> None:
        """The KV is in the decode replica's memory: cached blocks its decode leg's admission takes."""
        request, decode, _ = self.legs.pop(rid)
        kv, n = decode.scheduler.kv, request.num_prompt_tokens
        if kv.allocate_slots(rid, n):
            kv.cache_computed(rid, request.token_ids, n, request.cache_salt)
            kv.free(rid)
        else:
            self.result.recomputed += 1
        self.admit(decode, request, now)

    def finish(self) -> Result:
        result = super().finish()
        now = self.now
        for r in self.prefill:
            result.replica_s += now - r.launched_at
            result.busy_s += r.busy_s
            result.replica_busy.append((r.busy_s, now - r.launched_at))
        for arrived, request in self.decode_legs:
            first, last = request.first_token_time, request.finish_time
            if first is None or last is None:
                continue
            outs = request.num_output_tokens
            self.result.per_request.append((first - arrived, (last - first) / (outs - 1) if outs > 1 else 0.0))
        return result
