"""Status: the shape of one replica's ``/status`` answer, built by `agent.node.Agent.status` and served as is.

The models are frozen pydantic bodies: the wiring fills them from its parts, the API returns them, and the
OpenAPI document declares them (the JSON uses the ``from`` alias of a transition's source state).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.protocol.wire import AgentState, StartPhases

__all__ = [
    "AgentStatus",
    "Body",
    "ControlPlaneLink",
    "EngineInfo",
    "LoadInfo",
    "ModelStoreInfo",
    "StartInfo",
    "TransitionInfo",
]


class Body(BaseModel):
    """A frozen JSON body of the agent's API (fields settable by name or alias)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)


class EngineInfo(Body):
    kind: str
    version: str
    argv: list[str]
    log: str | None
    device: Literal["gpu", "cpu"] = Field(
        default="gpu", description="where the engine runs: cpu when the agent found no GPU (nvidia-smi) at its start"
    )
    dropped_flags: list[str] = Field(
        default_factory=list, description="the spec's flags left out on this device (vLLM on CPU), the log says why"
    )
    version_pinned: str = Field(default="", description="the pool's engine.version, the release the flags are for")
    version_matches: bool | None = Field(
        default=None,
        description="whether the engine's /version is the pinned release (a local label such as +cpu aside); None "
        "until the engine answered /version after its launch",
    )


class LoadInfo(Body):
    """The engine's load at the last scrape; None when that scrape failed."""

    waiting: float | None
    running: float | None
    kv_usage: float | None
    ttft_p99_s: float | None
    tokens_per_s: float | None


class ControlPlaneLink(Body):
    url: str | None
    consecutive_report_failures: int


class ModelStoreInfo(Body):
    """The model fetch (`agent.model_store`): where from and to, how far it got, and where the weights came from."""

    manifest: str
    model_dir: str
    phase: str = Field(description="idle, manifest, waiting_for_lock, downloading, done or failed")
    bytes_fetched: int
    source: str | None = Field(description="downloaded, cached or hub; None until a fetch succeeded")


StartInfo = StartPhases  # the same body the agent reports to the control plane (`fleet.protocol.wire`)


class TransitionInfo(Body):
    source: AgentState = Field(alias="from")
    event: str
    to: AgentState
    ago_s: float


class AgentStatus(Body):
    """Everything an operator asks of one replica (``Agent.status()``, ``GET /status``)."""

    replica: str
    pool: str
    model: str
    role: Literal["aggregated", "decode", "prefill"] = Field(
        default="aggregated", description="what the engine does in its pool (`PoolSpec.role`)"
    )
    side_channel: str | None = Field(
        default=None, description="a prefill or decode engine's NIXL handshake listener, host:port; None otherwise"
    )
    engine: EngineInfo
    engine_url: str
    engine_pid: int | None
    agent_url: str
    state: AgentState
    ready: bool
    state_since_s: float
    uptime_s: float
    engine_uptime_s: float
    restarts: int
    last_exit_code: int | None
    crash_failures_in_window: int
    load: LoadInfo
    control_plane: ControlPlaneLink
    gpus: list[dict[str, str]]
    last_error: str | None = Field(default=None, description="why the engine or the model fetch last failed")
    model_store: ModelStoreInfo | None = Field(default=None, description="None without a model store")
    start: StartInfo | None = Field(default=None, description="the current or last engine start; None before one")
    transitions: list[TransitionInfo] = Field(description="the last 20 state changes, oldest first")
