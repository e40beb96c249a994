"""The agent's series: restart counters exist at 0 for every reason the supervisor restarts an engine for."""

from __future__ import annotations

from prometheus_client import generate_latest

from agent.metrics import AgentMetrics
from agent.restarts import RestartReason

# The ``reason`` labels dashboards and alerts select on.
REASON_LABELS = [
    "crash", "spawn_failed", "engine_exited", "startup_timeout", "liveness_failed", "fetch_failed", "planned",
    "reset", "cooldown", "sleep_failed", "wake_failed", "wake_mismatch",
]  # fmt: skip


def test_every_restart_reason_the_supervisor_uses_is_exported_at_zero_before_the_first_restart() -> None:
    assert [reason.value for reason in RestartReason] == REASON_LABELS
    text = generate_latest(AgentMetrics("r0", "qwen-7b").registry).decode()
    for reason in REASON_LABELS:
        assert f'llmfleet_agent_engine_restarts_total{{reason="{reason}"}} 0.0' in text
