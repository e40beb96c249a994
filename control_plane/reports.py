"""Registry: the control plane's view of every reporter (agents, gateways), built from the reports they push.

A report is trusted for ``staleAfterS`` seconds after it *arrived* (the control plane's clock, not the reporter's
``ts``, so clock skew between machines cannot make a reporter look fresh). After that it is ``stale``: gateways
see the flag and the scaler treats its load as unknown, never as zero. Reporters silent for ``forget_after_s``
(``controlPlane.forgetAfterS``: by default the stale limit plus ten report intervals) are dropped: a dead replica
leaves the gateways' replica list and the scaler's view on that bounded timer.

`ReportRegistry` holds the last report per (pool, reporter id) under those rules, for any report type.
`ReplicaRegistry` keeps the agents' load reports and also drops ``stopped`` replicas after the stale limit and
answers the gateways' discovery (`replica_list`); `GatewayRegistry` keeps the gateways' admission queues and
request rates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from fleet.protocol.wire import GatewayReport, LoadReport, ReplicaInfo, ReplicaList, ReplicaState

__all__ = [
    "GatewayRegistry",
    "GatewaySeen",
    "ReplicaRegistry",
    "ReplicaSeen",
    "ReportRegistry",
    "Seen",
    "gateway_demand",
]


class Report(Protocol):
    """What the registry needs of a report: the pool it is about."""

    @property
    def pool(self) -> str: ...


R = TypeVar("R", bound=Report)


@dataclass(frozen=True)
class Seen(Generic[R]):
    """A reporter's last report about one pool, when it arrived, and whether that is too long ago."""

    report: R
    received_at: float
    age_s: float
    stale: bool


ReplicaSeen = Seen[LoadReport]
GatewaySeen = Seen[GatewayReport]


class ReportRegistry(Generic[R]):
    """The last report per (pool, reporter id), in memory; every method takes ``now`` so staleness is testable
    without sleeping. ``reporter`` names the report's sender (its replica or gateway id)."""

    def __init__(self, reporter: Callable[[R], str], stale_after_s: float, forget_after_s: float | None = None) -> None:
        self.stale_after_s = stale_after_s
        self.forget_after_s = forget_after_s if forget_after_s is not None else 20 * stale_after_s
        self._reporter = reporter
        self._last: dict[tuple[str, str], tuple[R, float]] = {}

    def record(self, report: R, now: float) -> None:
        self._last[(report.pool, self._reporter(report))] = (report, now)

    def forget(self, pool: str, reporter: str) -> None:
        self._last.pop((pool, reporter), None)

    def pools(self) -> set[str]:
        return {pool for pool, _ in self._last}

    def seen(self, pool: str, now: float) -> list[Seen[R]]:
        """Reporters on ``pool`` sorted by id, forgetting those `expired` says are gone."""
        out: list[Seen[R]] = []
        for (p, reporter), (report, at) in sorted(self._last.items()):
            if p != pool:
                continue
            age = max(0.0, now - at)
            if self.expired(report, age):
                del self._last[(p, reporter)]
                continue
            out.append(Seen(report, at, age, age > self.stale_after_s))
        return out

    def expired(self, report: R, age_s: float) -> bool:
        """Whether a report this old is dropped rather than shown as stale."""
        del report  # Unused: only the age matters here.
        return age_s > self.forget_after_s


class ReplicaRegistry(ReportRegistry[LoadReport]):
    """The agents' load reports; a ``stopped`` replica is forgotten once its report is stale."""

    def __init__(self, stale_after_s: float, forget_after_s: float | None = None) -> None:
        super().__init__(lambda r: r.replica, stale_after_s, forget_after_s)

    def expired(self, report: LoadReport, age_s: float) -> bool:
        return super().expired(report, age_s) or (report.state == ReplicaState.STOPPED and age_s > self.stale_after_s)

    def replica_list(self, pool: str, model: str, now: float) -> ReplicaList:
        """The discovery answer for gateways: every known replica except stopped ones, with its stale flag."""
        infos = [
            ReplicaInfo(
                replica=s.report.replica,
                pool=pool,
                engine_url=s.report.engine_url,
                state=s.report.state,
                stale=s.stale,
                last_report=s.report,
            )
            for s in self.seen(pool, now)
            if s.report.state != ReplicaState.STOPPED
        ]
        return ReplicaList(pool=pool, model=model, replicas=infos, generated_at=now)


class GatewayRegistry(ReportRegistry[GatewayReport]):
    """The gateways' last reports per pool, keyed by gateway id."""

    def __init__(self, stale_after_s: float, forget_after_s: float | None = None) -> None:
        super().__init__(lambda r: r.gateway, stale_after_s, forget_after_s)


def gateway_demand(seen: list[GatewaySeen]) -> tuple[float | None, float | None, int]:
    """(waiting, request rate, stale gateways) over one pool's gateway reports: the sums over fresh reports, or
    None for both when no gateway reported recently (unknown, not zero). The scaler's context takes these."""
    fresh = [g.report for g in seen if not g.stale]
    stale = len(seen) - len(fresh)
    if not fresh:
        return None, None, stale
    return float(sum(r.waiting for r in fresh)), sum(r.arrived_per_s for r in fresh), stale
