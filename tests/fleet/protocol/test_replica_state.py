"""One ReplicaState for agent, control plane and simulator: it is its string on the wire, and an agent cannot
report the control plane's own ``launching``."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from agent.states import AGENT_STATES, State
from fleet.protocol.wire import LoadReport, ReplicaState

REPORT = {
    "replica": "r1",
    "pool": "p",
    "engine_url": "http://127.0.0.1:1",
    "model": "m",
    "engine_version": "sim",
    "ts": 1.0,
}


@pytest.mark.parametrize("state", [s.value for s in AGENT_STATES])
def test_an_agent_state_travels_as_its_string(state: str) -> None:
    report = LoadReport.model_validate({**REPORT, "state": state})
    assert report.state is ReplicaState(state) and report.state == state
    assert json.loads(report.model_dump_json())["state"] == state


def test_an_agent_cannot_report_launching() -> None:
    with pytest.raises(ValidationError, match="launching is the control plane's state"):
        LoadReport.model_validate({**REPORT, "state": "launching"})


def test_the_agent_machine_uses_the_fleet_enum_without_launching() -> None:
    assert State is ReplicaState
    assert set(AGENT_STATES) == set(ReplicaState) - {ReplicaState.LAUNCHING}
