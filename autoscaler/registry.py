"""ReplicaRegistry: the control plane's view of every replica, built from the agents' load reports.

A report is trusted for ``staleAfterS`` seconds after it *arrived* (the control plane's clock, not the agent's
``ts``, so clock skew between machines cannot make a replica look fresh). After that the replica is ``stale``:
gateways see the flag and the scaler treats its load as unknown, never as zero. Replicas silent for
``forget_after_s`` (default 20x the stale limit) are dropped, as are ``stopped`` ones after the stale limit.

`GatewayRegistry` keeps the gateways' reports (their admission queues and request rates) under the same rules:
a gateway silent for ``staleAfterS`` is ``stale`` (its queue is unknown, not empty) and is forgotten after
``forget_after_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.wire import GatewayReport, LoadReport, ReplicaInfo, ReplicaList

__all__ = ["GatewayRegistry", "GatewaySeen", "ReplicaRegistry", "Seen"]


@dataclass(frozen=True)
class Seen:
    """A replica's last report, when it arrived, and whether that is too long ago."""

    report: LoadReport
    received_at: float
    age_s: float
    stale: bool


class ReplicaRegistry:
    """In-memory registry; every method takes ``now`` so staleness is testable without sleeping."""

    def __init__(self, stale_after_s: float, forget_after_s: float | None = None) -> None:
        self.stale_after_s = stale_after_s
        self.forget_after_s = forget_after_s if forget_after_s is not None else 20 * stale_after_s
        self._last: dict[tuple[str, str], tuple[LoadReport, float]] = {}

    def record(self, report: LoadReport, now: float) -> None:
        self._last[(report.pool, report.replica)] = (report, now)

    def forget(self, pool: str, replica: str) -> None:
        self._last.pop((pool, replica), None)

    def seen(self, pool: str, now: float) -> list[Seen]:
        """Replicas of ``pool`` sorted by id, forgetting the long-silent and long-stopped ones."""
        out: list[Seen] = []
        for (p, replica), (report, at) in sorted(self._last.items()):
            if p != pool:
                continue
            age = max(0.0, now - at)
            if age > self.forget_after_s or (report.state == "stopped" and age > self.stale_after_s):
                del self._last[(p, replica)]
                continue
            out.append(Seen(report, at, age, age > self.stale_after_s))
        return out

    def pools(self) -> set[str]:
        return {pool for pool, _ in self._last}

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
            if s.report.state != "stopped"
        ]
        return ReplicaList(pool=pool, model=model, replicas=infos, generated_at=now)


@dataclass(frozen=True)
class GatewaySeen:
    """A gateway's last report about one pool, when it arrived, and whether that is too long ago."""

    report: GatewayReport
    received_at: float
    age_s: float
    stale: bool


class GatewayRegistry:
    """The gateways' last reports per pool; like `ReplicaRegistry`, trusted by arrival time on our clock."""

    def __init__(self, stale_after_s: float, forget_after_s: float | None = None) -> None:
        self.stale_after_s = stale_after_s
        self.forget_after_s = forget_after_s if forget_after_s is not None else 20 * stale_after_s
        self._last: dict[tuple[str, str], tuple[GatewayReport, float]] = {}

    def record(self, report: GatewayReport, now: float) -> None:
        self._last[(report.pool, report.gateway)] = (report, now)

    def seen(self, pool: str, now: float) -> list[GatewaySeen]:
        """Gateways reporting on ``pool`` sorted by id, forgetting the long-silent ones."""
        out: list[GatewaySeen] = []
        for (p, gateway), (report, at) in sorted(self._last.items()):
            if p != pool:
                continue
            age = max(0.0, now - at)
            if age > self.forget_after_s:
                del self._last[(p, gateway)]
                continue
            out.append(GatewaySeen(report, at, age, age > self.stale_after_s))
        return out
