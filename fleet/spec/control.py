"""Control spec: the autoscaler's targets and stabilisation, and where the control plane listens.

Part of `fleet.spec.stack` (every model is importable from there).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from fleet.spec.base import PluginRef, Spec

__all__ = ["FORGET_AFTER_REPORTS", "AutoscalingSpec", "ControlPlaneSpec"]

# A reporter silent this many report intervals past the stale limit is taken for gone (the default forgetAfterS).
FORGET_AFTER_REPORTS = 10


class AutoscalingSpec(Spec):
    policy: PluginRef = Field(default_factory=lambda: PluginRef(name="target-tracking"))
    """Scaling policy by name (target-tracking, threshold) with parameters."""
    actuator: str = "local"
    """What carries decisions out: local, kubernetes, aws."""
    dry_run: bool = False
    """Log decisions without acting."""
    interval_s: float = Field(default=5.0, gt=0, le=600)
    """Control loop period."""
    target_queue_per_replica: float = Field(default=4.0, gt=0, le=10_000)
    """Waiting requests per replica the policy aims for."""
    target_kv_usage: float = Field(default=0.75, gt=0, le=1.0)
    """KV cache usage the policy aims for."""
    target_utilisation: float = Field(default=0.75, gt=0, le=1.0)
    """Busy fraction the policy aims for (the seed's 70-85% band)."""
    scale_up_stabilization_s: float = Field(default=0.0, ge=0, le=3600)
    """How long a higher desired count must persist before scaling up."""
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86_400)
    """How long a lower desired count must persist before scaling down."""
    max_scale_up_step: int = Field(default=4, ge=1, le=1000)
    """Most replicas added per decision."""
    max_scale_down_step: int = Field(default=1, ge=1, le=1000)
    """Most replicas removed per decision."""
    predictive: bool = False
    """Add the demand trend over the cold-start horizon."""
    predictive_fit_s: float | None = Field(default=None, gt=0, le=3600)
    """Window the predictive trend is fitted over (default: the cold start); the term acts only once the demand
    samples cover it, so a trend of a few ticks is never projected."""
    predictive_max_step: int = Field(default=2, ge=0, le=1000)
    """Most replicas the predictive term adds above the policy's own number."""
    ttft_queue_per_replica: float = Field(default=1.0, ge=0, le=10_000)
    """Requests waiting (engines + gateways) per ready replica from which a P99 TTFT over the SLO counts as
    queueing; below it the misses are prefill more replicas cannot shorten, and the TTFT rule neither adds a
    replica nor blocks a scale-down. 0: any P99 over the SLO acts."""
    ttft_queue_window_s: float | None = Field(default=None, ge=0, le=3600)
    """The queue that evidence is the median of the ticks of this window (default the cold start): a burst's
    own backlog, gone before a replica launched now could serve, is not queueing it can fix. 0: this tick's."""


class ControlPlaneSpec(Spec):
    port: int = Field(default=8090, ge=1, le=65535)
    """Control plane listen port."""
    url: str | None = None
    """Where agents and gateways reach it; default derived per target."""
    report_interval_s: float = Field(default=1.0, gt=0, le=60)
    """How often agents report."""
    stale_after_s: float = Field(default=5.0, gt=0, le=600)
    """A replica whose last report is older is stale (never read as idle)."""
    lease_ttl_s: float = Field(default=600.0, gt=0, le=86_400)
    """A restart lease expires after this if its holder does not release it."""
    forget_after_s: float | None = Field(default=None, gt=0, le=86_400)
    """A replica or gateway silent this long leaves the control plane's lists (discovery, the scaler's view);
    more than staleAfterS. Default: staleAfterS + 10 x reportIntervalS (15 s with the defaults)."""

    @model_validator(mode="after")
    def _forget_after_stale(self) -> ControlPlaneSpec:
        if self.forget_after_s is not None and self.forget_after_s <= self.stale_after_s:
            raise ValueError(
                f"forgetAfterS {self.forget_after_s:g} must be more than staleAfterS {self.stale_after_s:g}: a "
                "replica is stale (listed, its load unknown) before it is forgotten"
            )
        return self

    @property
    def forget_after(self) -> float:
        """Seconds of silence after which a reporter is forgotten: ``forgetAfterS`` or its default."""
        if self.forget_after_s is not None:
            return self.forget_after_s
        return self.stale_after_s + FORGET_AFTER_REPORTS * self.report_interval_s

    @property
    def client_url(self) -> str:
        """Where an operator's command reaches it: ``url``, else this machine's port (the local fleet)."""
        return self.url or f"http://127.0.0.1:{self.port}"
