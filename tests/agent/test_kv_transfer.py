"""KV transfer: the exact ``--kv-transfer-config`` and environment a prefill or decode engine gets, per host and
launcher, the side channel the agent picks, and the role its /status and reports name."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest

from agent import cli
from agent.launchers import LaunchConfig, Launcher, make_launcher
from agent.launchers.kv_transfer import SideChannel
from agent.node import Agent, AgentOptions
from fleet.protocol.wire import LoadReport
from fleet.spec.loader import load_spec
from fleet.spec.stack import PoolSpec
from tests.agent.builders import VirtualClock
from tests.support import stacks

UCX_KEYS = ("UCX_TLS", "UCX_NET_DEVICES")
NIXL_KEYS = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")
LOCAL = SideChannel("127.0.0.1", 15600)


def _pd_pool(kind: str, role: str, **disaggregation: object) -> PoolSpec:
    """The local-sim preset's pool disaggregated, of engine ``kind``: itself (``decode``) or its prefill role pool."""
    keys = {f"disaggregation.{k}": v for k, v in disaggregation.items()}
    pool = stacks.pool(**{"engine.kind": kind, "disaggregation.thresholdTokens": 256, **keys})
    if role == "decode":
        return pool
    prefill = pool.prefill_pool()
    assert prefill is not None
    return prefill


def _launcher(pool: PoolSpec, device: str = "cpu", side_channel: SideChannel | None = LOCAL) -> Launcher:
    config = LaunchConfig(host="127.0.0.1", port=8000, device=device, side_channel=side_channel)  # type: ignore[arg-type]
    return make_launcher(pool, config)


def _kv_config(argv: list[str]) -> object:
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


@pytest.fixture(autouse=True)
def _no_ucx_of_our_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (*UCX_KEYS, *NIXL_KEYS, "POD_IP"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize(
    ("name", "role", "device", "expected"),
    [
        (
            "prefill on a CPU host",
            "prefill",
            "cpu",
            '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cpu",'
            '"kv_connector_extra_config":{"backends":["UCX"]},"kv_load_failure_policy":"fail"}',
        ),
        (
            "decode on a CPU host",
            "decode",
            "cpu",
            '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_buffer_device":"cpu",'
            '"kv_connector_extra_config":{"backends":["UCX"]},"kv_load_failure_policy":"fail"}',
        ),
        (
            "prefill on a GPU host: vLLM's own buffer device (cuda)",
            "prefill",
            "gpu",
            '{"kv_connector":"NixlConnector","kv_role":"kv_producer",'
            '"kv_connector_extra_config":{"backends":["UCX"]},"kv_load_failure_policy":"fail"}',
        ),
        (
            "decode on a GPU host",
            "decode",
            "gpu",
            '{"kv_connector":"NixlConnector","kv_role":"kv_consumer",'
            '"kv_connector_extra_config":{"backends":["UCX"]},"kv_load_failure_policy":"fail"}',
        ),
    ],
)
def test_each_role_gets_vllms_kv_transfer_config_as_compact_json_after_the_spec_flags(
    name: str, role: str, device: str, expected: str
) -> None:
    del name  # The table's label.
    argv = _launcher(_pd_pool("vllm", role), device).argv()
    aggregated = _launcher(stacks.pool(**{"engine.kind": "vllm"}), device).argv()
    assert argv == [*aggregated, "--kv-transfer-config", expected]


def test_the_stacks_backends_and_failure_policy_reach_the_config() -> None:
    pool = _pd_pool("vllm", "decode", backends=["LIBFABRIC"], kvLoadFailurePolicy="recompute")
    config = _kv_config(_launcher(pool, "gpu").argv())
    assert config == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"backends": ["LIBFABRIC"]},
        "kv_load_failure_policy": "recompute",
    }


@pytest.mark.parametrize(
    ("name", "device", "side_channel", "expected"),
    [
        (
            "CPU host, local side channel: UCX over TCP on loopback",
            "cpu",
            LOCAL,
            {
                "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                "VLLM_NIXL_SIDE_CHANNEL_PORT": "15600",
                "UCX_TLS": "tcp,self",
                "UCX_NET_DEVICES": "lo",
            },
        ),
        (
            "GPU host: UCX chooses its own transports",
            "gpu",
            LOCAL,
            {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "15600"},
        ),
        (
            "CPU pod on a cluster: its engines are on other hosts, loopback would be wrong",
            "cpu",
            SideChannel("10.0.3.7", 5600),
            {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.3.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"},
        ),
    ],
)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_each_role_gets_the_side_channel_and_ucx_only_where_the_cpu_run_needed_it(
    name: str, device: str, side_channel: SideChannel, expected: dict[str, str], role: str
) -> None:
    del name  # The table's label.
    env = _launcher(_pd_pool("vllm", role), device, side_channel).environment()
    assert {k: env[k] for k in (*UCX_KEYS, *NIXL_KEYS) if k in env} == expected


def test_ucx_settings_of_the_agents_own_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_TLS", "tcp")
    env = _launcher(_pd_pool("vllm", "prefill")).environment()
    assert env["UCX_TLS"] == "tcp" and env["UCX_NET_DEVICES"] == "lo"


def test_the_libfabric_backend_gets_no_ucx_settings() -> None:
    env = _launcher(_pd_pool("vllm", "decode", backends=["LIBFABRIC"])).environment()
    assert not set(UCX_KEYS) & set(env) and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "15600"


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_an_aggregated_pool_gets_no_kv_transfer(kind: str) -> None:
    launcher = _launcher(stacks.pool(**{"engine.kind": kind}))
    assert "--kv-transfer-config" not in launcher.argv()
    assert not {*UCX_KEYS, *NIXL_KEYS} & set(launcher.environment())


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_simulator_gets_the_flag_and_environment_of_the_engine_it_plays(role: str) -> None:
    sim = _launcher(_pd_pool("sim", role), "cpu")  # an a100 profile: a GPU engine's config
    vllm_gpu = _launcher(_pd_pool("vllm", role), "gpu")
    assert _kv_config(sim.argv()) == _kv_config(vllm_gpu.argv())
    argv, at = sim.argv(), sim.argv().index("--kv-transfer-config")
    del argv[at : at + 2]
    assert argv == _launcher(stacks.pool(), "cpu").argv()  # the one difference from an aggregated simulator's
    cpu_build = stacks.pool(**{"engine.sim.gpuProfile": "cpu-tiny", "disaggregation.thresholdTokens": 256})
    pool = cpu_build if role == "decode" else cpu_build.prefill_pool()
    assert pool is not None
    sim_cpu, vllm_cpu = _launcher(pool, "cpu"), _launcher(_pd_pool("vllm", role), "cpu")
    assert _kv_config(sim_cpu.argv()) == _kv_config(vllm_cpu.argv())
    env = sim_cpu.environment()
    assert {k: env[k] for k in (*UCX_KEYS, *NIXL_KEYS)} == {
        k: vllm_cpu.environment()[k] for k in (*UCX_KEYS, *NIXL_KEYS)
    }


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_local_agent_takes_a_free_side_channel_port_on_its_advertised_host() -> None:
    spec = load_spec("local-pd").spec
    first = cli.side_channel(_args("--stack", "local-pd", "--pool", "qwen-7b-prefill", "--port", "1"), spec, {})
    assert first is not None and first.host == "127.0.0.1" and first.port > 0
    pinned = _args("--stack", "local-pd", "--pool", "qwen-7b", "--port", "1", "--side-channel-port", "17001")
    assert cli.side_channel(pinned, spec, {}) == SideChannel("127.0.0.1", 17001)
    assert (
        cli.side_channel(_args("--stack", "local", "--pool", "qwen-7b", "--port", "1"), load_spec("local").spec, {})
        is None
    )


def test_a_pod_binds_its_side_channel_on_its_pod_ip_at_the_stacks_port(tmp_path: Path) -> None:
    overrides = {"pools.0.disaggregation": {"sideChannelPort": 5700}}
    stack = stacks.write_stack(tmp_path / "Pulumi.pdtest.yaml", "aws", **overrides)
    args = _args("--stack", str(stack), "--pool", "qwen-7b-prefill", "--port", "1", "--host", "0.0.0.0")
    spec = load_spec(stack).spec
    assert cli.side_channel(args, spec, {"POD_IP": "10.0.3.7"}) == SideChannel("10.0.3.7", 5700)
    options = cli.build_options(args, spec)
    assert options.side_channel is not None and options.side_channel.port == 5700


@pytest.mark.parametrize(
    ("pool_name", "role", "side_channel"),
    [("qwen-7b-prefill", "prefill", "127.0.0.1:15600"), ("qwen-7b", "decode", "127.0.0.1:15600")],
)
async def test_status_and_reports_name_the_role_and_the_side_channel(
    pool_name: str, role: str, side_channel: str
) -> None:
    pool = load_spec("local-pd").spec.pool(pool_name)
    options = AgentOptions(replica="r0", port=1, engine_port=2, side_channel=LOCAL)
    async with httpx.AsyncClient() as http:
        agent = Agent(pool, options, http, VirtualClock())
        report = agent.make_report(agent.reporter.last_load)
        status = agent.status()
    assert (report.role, report.side_channel) == (role, side_channel)
    assert (status.role, status.side_channel) == (role, side_channel)
    assert "--kv-transfer-config" in status.engine.argv


async def test_an_aggregated_agent_reports_no_side_channel_and_old_reports_still_parse() -> None:
    async with httpx.AsyncClient() as http:
        agent = Agent(stacks.pool(), AgentOptions(replica="r0", port=1, engine_port=2, side_channel=LOCAL), http)
        report = agent.make_report(agent.reporter.last_load)
    assert (report.role, report.side_channel, agent.status().side_channel) == ("aggregated", None, None)
    old = report.model_dump(mode="json", exclude={"role", "side_channel"})
    assert LoadReport.model_validate(old).role == "aggregated"
