"""The configurations a simulation compares: routing x scaling, each built from the real plugins by name.

Routing (`gateway.routing` plugins; filters are always the stack's):

* ``round-robin`` and ``random``: those pickers, no scorers;
* ``p2c``: the ``p2c`` picker over the stack's load scorers (its scorers without the affinity ones);
* ``p2c+prefix``: the same plus ``prefix-affinity`` (the stack's own reference when it has one, else weight 1);
* ``p2c+kv``: the same load scorers plus ``kv-cache`` (the stack's own reference when it has one, else weight 1, as
  ``prefix-affinity``'s), its index fed by the replicas' own KV events after ``kv_delay_s`` (`simulate.kvfeed`);
* ``work+kv``: ``kv-cache`` with the ``least-work`` picker, which reads only that scorer's share: the replica
  whose queued prefill, plus this request's uncached part there, plus a tenth of its decoding context is least;
* ``oracle-kv``: the yardstick of ``p2c+kv`` (and the one ``work+kv`` is measured against): the same load
  scorers, picker and weight with `simulate.kv_oracle.OracleKv` instead of ``kv-cache``: each replica's real
  cached prefix, no delay.

Scaling (`control_plane.scaling.policies` through `simulate.control.Controller`, the live loop's decision step):

* ``fixed``: no scaler: the pool runs the capacity plan's replica count for the trace's peak, from the start;
* ``threshold``, ``target-tracking``: those policies, ``autoscaling.predictive`` off;
* ``target-tracking+predictive``: ``target-tracking`` with the predictive term on;
* ``oracle``: `simulate.oracle.OracleScaler`, which reads the trace (built by `simulate.replay.run_config`, the
  only place that has it).

``fixed`` with ``replicas`` set runs that many replicas instead of the plan's count: the points of the
frontier (`simulate.frontier`).

A policy takes the stack's ``autoscaling.policy.params`` when the stack names that policy. ``stack`` stands for
what the stack itself configures (``p2c+prefix`` for a stack routing with prefix affinity and p2c).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.spec.stack import FleetSpec, PluginRef, PoolSpec
from gateway.routing.base import Router
from gateway.routing.scorers.kv_cache import KvCache
from simulate.control import Controller
from simulate.kv_oracle import OracleKv
from simulate.kvfeed import KV_EVENT_DELAY_S

__all__ = ["ROUTINGS", "SCALINGS", "Config", "make_controller", "make_router", "stack_config"]

ROUTINGS = ("round-robin", "random", "p2c", "p2c+prefix", "p2c+kv", "work+kv", "oracle-kv")
SCALINGS = ("fixed", "threshold", "target-tracking", "target-tracking+predictive", "oracle")
AFFINITY_SCORERS = frozenset({"prefix-affinity", "session-affinity", "rendezvous-affinity", "kv-cache"})
# the affinity scorer each p2c routing adds to the load scorers (``oracle-kv`` weighs as ``kv-cache``)
_AFFINITY = {"p2c+prefix": "prefix-affinity", "p2c+kv": "kv-cache", "work+kv": "kv-cache", "oracle-kv": "kv-cache"}


@dataclass(frozen=True)
class Config:
    routing: str
    scaling: str
    replicas: int | None = None  # ``fixed`` only: this many replicas instead of the plan's
    kv_delay_s: float = KV_EVENT_DELAY_S  # ``p2c+kv``: KV events reach the gateway's index this much later
    age_s: float = 0.0  # how long the replicas ready at the start have been up (`simulate.week`)

    @property
    def name(self) -> str:
        size = "" if self.replicas is None else f" {self.replicas}"
        return f"{self.routing} / {self.scaling}{size}"


def stack_config(spec: FleetSpec) -> Config:
    """The stack's own routing and scaling, named as in ROUTINGS and SCALINGS (nearest match)."""
    routing = spec.gateway.routing
    names = {s.name for s in routing.scorers}
    if routing.picker.name in ("round-robin", "random"):
        route = routing.picker.name
    else:
        route = "p2c+prefix" if "prefix-affinity" in names else "p2c+kv" if "kv-cache" in names else "p2c"
        route = "work+kv" if routing.picker.name == "least-work" else route
    policy = spec.autoscaling.policy.name
    scale = policy + ("+predictive" if spec.autoscaling.predictive and policy == "target-tracking" else "")
    return Config(route, scale if scale in SCALINGS else "target-tracking")


def make_router(spec: FleetSpec, routing: str, seed: int) -> Router:
    if routing not in ROUTINGS:
        raise ValueError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")
    r = spec.gateway.routing
    picker = "p2c" if routing.startswith("p2c") or routing == "oracle-kv" else routing
    picker = "least-work" if routing == "work+kv" else picker
    scorers = [s for s in r.scorers if s.name not in AFFINITY_SCORERS] if picker == "p2c" else []
    affinity = _AFFINITY.get(routing)
    if affinity is not None:
        own = [s for s in r.scorers if s.name == affinity]
        scorers.append(own[0] if own else PluginRef(name=affinity))
    params = dict(r.picker.params) if r.picker.name == picker else {}
    pick = PluginRef(name=picker, params={**params, "seed": seed})
    if routing != "oracle-kv":
        return Router.from_refs(r.filters, scorers, pick)
    router = Router.from_refs(r.filters, scorers[:-1], pick)  # the oracle is no plugin: built here, same weight
    kv = KvCache.Params.model_validate(scorers[-1].params)  # and the same minShare as the kv-cache it measures
    router.scorers.append((OracleKv(min_share=kv.min_share), scorers[-1].weight))
    return router


def make_controller(spec: FleetSpec, pool: PoolSpec, scaling: str) -> Controller | None:
    """The scaler for ``scaling``; None for ``fixed``. ``oracle`` reads the trace: `simulate.replay` builds it."""
    if scaling not in SCALINGS:
        raise ValueError(f"unknown scaling {scaling!r}; choose from {', '.join(SCALINGS)}")
    if scaling == "oracle":
        raise ValueError("the oracle scaler is built from the trace: simulate.replay.run_config")
    if scaling == "fixed":
        return None
    name = scaling.removesuffix("+predictive")
    own = spec.autoscaling.policy
    ref = own if own.name == name else PluginRef(name=name)
    autoscaling = spec.autoscaling.model_copy(update={"policy": ref, "predictive": scaling.endswith("+predictive")})
    return Controller.for_pool(spec, pool, autoscaling=autoscaling)
