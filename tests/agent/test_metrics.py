"""The agent's series: restart counters exist at 0 for every reason the supervisor restarts an engine for."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

import agent.supervisor
from agent.metrics import RESTART_REASONS, AgentMetrics


def test_every_restart_reason_the_supervisor_uses_is_exported_at_zero_before_the_first_restart() -> None:
    source = Path(agent.supervisor.__file__).read_text()
    used = set(re.findall(r'_restart_reason = "(\w+)"', source)) | set(re.findall(r'_failure\([^)]*"(\w+)"\)', source))
    assert used and used <= set(RESTART_REASONS), sorted(used - set(RESTART_REASONS))
    text = generate_latest(AgentMetrics("r0", "qwen-7b").registry).decode()
    for reason in RESTART_REASONS:
        assert f'llmfleet_agent_engine_restarts_total{{reason="{reason}"}} 0.0' in text
