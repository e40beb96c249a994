"""Metrics: the agent's own Prometheus metrics, in a registry per agent instance (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from agent.restarts import RestartReason
from agent.states import AGENT_STATES, State, Transition

__all__ = ["AgentMetrics"]


class AgentMetrics:
    """``llmfleet_agent_*``: state, every transition, restarts by reason, crash-loop alert, reports, leases, and
    the model fetch (``llmfleet_agent_model_*``: bytes downloaded, files verified, checksum failures, seconds),
    the current engine start by phase (``llmfleet_agent_start_phase_seconds``, `agent.starts`), and whether the
    engine runs another release than the pool pins (``llmfleet_agent_engine_version_mismatch``,
    `agent.engine_client.version_matches`)."""

    def __init__(self, replica: str, pool: str, initial: State = State.STARTING) -> None:
        self.registry = CollectorRegistry()
        labels = {"replica": replica, "pool": pool}
        r = self.registry
        self.state = Gauge("llmfleet_agent_state", "1 for the agent's current state", ["state"], registry=r)
        self.transitions = Counter(
            "llmfleet_agent_transitions", "State transitions", ["source", "event", "target"], registry=r
        )
        self.restarts = Counter("llmfleet_agent_engine_restarts", "Engine restarts", ["reason"], registry=r)
        for reason in RestartReason:  # at 0 from the start: rate() then sees a reason's first restart too
            self.restarts.labels(reason.value)
        self.crash_loop = Gauge("llmfleet_agent_crash_loop", "1 while the engine is crash-looping (alert)", registry=r)
        self.ready = Gauge("llmfleet_agent_ready", "1 when the replica is routable", registry=r)
        self.reports = Counter("llmfleet_agent_reports", "Load reports pushed", ["result"], registry=r)
        self.scrapes = Counter("llmfleet_agent_engine_scrapes", "Engine /metrics scrapes", ["result"], registry=r)
        self.leases = Counter("llmfleet_agent_restart_leases", "Restart lease requests", ["result"], registry=r)
        self.model_fetched_bytes = Counter(
            "llmfleet_agent_model_fetched_bytes", "Bytes downloaded from the model store", registry=r
        )
        self.model_files_verified = Counter(
            "llmfleet_agent_model_files_verified", "Downloaded model files whose sha256 matched the manifest",
            registry=r,
        )  # fmt: skip
        self.model_checksum_failures = Counter(
            "llmfleet_agent_model_checksum_failures", "Downloaded model files whose sha256 did not match", registry=r
        )
        self.model_fetch_seconds = Gauge(
            "llmfleet_agent_model_fetch_seconds", "Duration of the last model fetch, waiting for the lock included",
            registry=r,
        )  # fmt: skip
        self.model_fetches = Counter(
            "llmfleet_agent_model_fetches", "Model fetches by result (downloaded, cached, hub, failed)", ["result"],
            registry=r,
        )  # fmt: skip
        self.start_phase = Gauge(
            "llmfleet_agent_start_phase_seconds",
            "Seconds each phase of the current or last engine start took (fetch, load, compile, graphs, ready)",
            ["phase"], registry=r,
        )  # fmt: skip
        self.engine_version_mismatch = Gauge(
            "llmfleet_agent_engine_version_mismatch",
            "1 while the engine's /version is another release than the pool's engine.version (a local label aside)",
            registry=r,
        )
        self.info = Gauge("llmfleet_agent_info", "Replica identity", list(labels), registry=r)
        self.info.labels(**labels).set(1)
        for state in AGENT_STATES:
            self.state.labels(state.value).set(1 if state is initial else 0)

    def on_transition(self, transition: Transition) -> None:
        self.state.labels(transition.source.value).set(0)
        self.state.labels(transition.target.value).set(1)
        self.transitions.labels(transition.source.value, transition.event.value, transition.target.value).inc()
        self.ready.set(1 if transition.target is State.READY else 0)
        self.crash_loop.set(1 if transition.target is State.FAILED else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
