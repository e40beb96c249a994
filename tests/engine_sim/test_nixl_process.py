"""P/D over NIXL between real ``llmfleet sim serve`` processes, driven as vLLM's toy proxy drives vLLM (the research
probe's legs: a prefill leg with ``max_tokens: 1``, then the streamed decode leg with its ``kv_transfer_params``).

The engines play vLLM's CPU build (``cpu-tiny``: 128-token blocks), as the probe that captured vLLM 0.32's answers
ran. One prefill engine and two decode engines (policy ``fail`` and ``recompute``) serve the whole module; a
second prefill engine is SIGKILLed after its leg for the failure tests.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.protocol.ports import free_port
from tests.support.procs import Proc, Procs
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

PROMPT = " ".join(f"word{i}" for i in range(200))
BODY = {"model": "qwen", "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
# The toy proxy's prefill leg (research file 1.4): its own kv_transfer_params, stream false, one token.
LEG1_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
LEG1 = {**BODY, "max_tokens": 1, "stream": False, "kv_transfer_params": LEG1_PARAMS}
HEADERS = {"X-Request-Id": "pd-test-1"}
# vLLM 0.32's answer to the prefill leg, in its order (research/pd_probe/result_nixl_success.json).
CAPTURED_KEYS = [
    "do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id",
    "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens",
    "remote_blocks_expiry_time", "transfer_mode", "remote_prefill_cached_tokens",
]  # fmt: skip
GENERATION_ERROR = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None,
                              "code": 500}}  # fmt: skip


@dataclass
class Engines:
    prefill: Proc
    prefill_engine_id: str
    prefill_side_port: int
    decode_fail: Proc
    decode_recompute: Proc
    dead_prefill_params: dict[str, Any]  # a leg-1 answer whose engine was SIGKILLed after it


def _spawn(procs: Procs, name: str, role: str | None, side_port: int, **config: Any) -> Proc:
    """A simulated CPU engine with NIXL as the agent launches one (``role`` None: no ``kv_role`` in the config)."""
    port = free_port()
    kv: dict[str, Any] = {"kv_connector": "NixlConnector"}
    if role is not None:
        kv["kv_role"] = role
    kv.update({"kv_buffer_device": "cpu", "kv_connector_extra_config": {"backends": ["UCX"]}, **config})
    argv = ["sim", "serve", "Qwen/Qwen2.5-7B-Instruct", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--served-model-name", "qwen", "--max-model-len", "4096", "--gpu-profile", "cpu-tiny"]
    argv += ["--startup-seconds", "0", "--time-scale", "20", "--enable-prompt-tokens-details"]
    argv += ["--kv-transfer-config", json.dumps(kv)]
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port)}
    return procs.start(argv, name=name, url=f"http://127.0.0.1:{port}", env=env)


def _prefill_leg(proc: Proc) -> dict[str, Any]:
    response = proc.post("/v1/completions", json=LEG1, headers=HEADERS, timeout=30)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    procs = Procs(tmp_path_factory.mktemp("nixl"))
    try:
        side, dead_side = free_port(), free_port()
        engine_id = "3b771579-22fe-4d73-acbc-e5dd61c68272"
        prefill = _spawn(procs, "prefill", "kv_producer", side, engine_id=engine_id)
        dead = _spawn(procs, "dead-prefill", "kv_producer", dead_side)
        decode_fail = _spawn(procs, "decode-fail", "kv_consumer", free_port())
        decode_recompute = _spawn(procs, "decode-recompute", "kv_consumer", free_port(),
                                  kv_load_failure_policy="recompute")  # fmt: skip
        for proc in (prefill, dead, decode_fail, decode_recompute):
            proc.wait_http("/health", timeout_s=30)
        dead_params = _prefill_leg(dead)["kv_transfer_params"]
        dead.kill()
        yield Engines(prefill, engine_id, side, decode_fail, decode_recompute, dead_params)
    finally:
        procs.close()


def _stream(proc: Proc, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """A streamed leg: its status and decoded ``data:`` payloads (``"[DONE]"`` kept as a string)."""
    events: list[Any] = []
    with httpx.stream("POST", f"{proc.url}/v1/completions", json=body, headers=HEADERS, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
        return response.status_code, events


def _text(events: list[Any]) -> str:
    return "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices"))


def _decode_leg(params: dict[str, Any]) -> dict[str, Any]:
    return {**BODY, "stream": True, "stream_options": {"include_usage": True}, "kv_transfer_params": params}


def _metric(proc: Proc, name: str, having: str = "") -> float:
    """The value of the first series of ``name`` whose line holds ``having``."""
    for line in proc.get("/metrics").text.splitlines():
        if line.startswith(name) and having in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{proc.name} exports no {name} with {having!r}")


def _usage(proc: Proc) -> float:
    return _metric(proc, "vllm:kv_cache_usage_perc")


@pytest.fixture(scope="module")
def reference(engines: Engines) -> str:
    """The aggregated answer, on the prefill engine (as the probe took it, which also warms its prefix cache)."""
    response = engines.prefill.post("/v1/completions", json=BODY, timeout=30)
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["text"]
    return text


def test_a_prefill_leg_answers_the_kv_transfer_params_vllm_returns_and_holds_its_blocks(
    engines: Engines, reference: str
) -> None:
    del reference  # Used: the prefill engine has the prompt's full blocks cached, as in the capture.
    answer = _prefill_leg(engines.prefill)
    params, prompt = answer["kv_transfer_params"], answer["usage"]["prompt_tokens"]
    assert list(params) == CAPTURED_KEYS
    assert params["remote_request_id"].startswith("cmpl-pd-test-1-0-")
    assert {k: v for k, v in params.items() if k not in ("remote_block_ids", "remote_request_id")} == {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": engines.prefill_engine_id,
        "remote_host": "127.0.0.1", "remote_port": engines.prefill_side_port, "tp_size": 1, "dcp_size": 1,
        "pp_size": 1, "remote_num_tokens": prompt, "remote_blocks_expiry_time": None, "transfer_mode": "pull",
        "remote_prefill_cached_tokens": (prompt - 1) // 128 * 128,
    }  # fmt: skip
    (group,) = params["remote_block_ids"]
    assert len(group) == math.ceil(prompt / 128) and 0 not in group  # vLLM's block 0 is its null block
    assert _usage(engines.prefill) > 0  # held for the pull, not freed at finish


def test_a_decode_leg_streams_the_aggregated_text_from_pulled_blocks_and_frees_the_prefill_engines(
    engines: Engines, reference: str
) -> None:
    before = _usage(engines.prefill)  # the first test's leg is still leased (30 s)
    params = _prefill_leg(engines.prefill)["kv_transfer_params"]
    assert _usage(engines.prefill) > before  # its own last (partial) block, at least, is held
    status, events = _stream(engines.decode_fail, _decode_leg(params))
    assert status == 200 and events[-1] == "[DONE]", events
    assert _text(events) == reference
    prompt = params["remote_num_tokens"]
    assert events[-2]["usage"] == {
        "prompt_tokens": prompt, "total_tokens": prompt + 12, "completion_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": params["remote_prefill_cached_tokens"]},
    }  # fmt: skip
    assert "kv_transfer_params" not in events[-2]  # 0.32's streams carry none
    decode = engines.decode_fail
    # No prefill work on the decode engine: all but the last prompt token came over the transfer.
    assert _metric(decode, "vllm:prompt_tokens_by_source_total", "external_kv_transfer") == prompt - 1
    assert _metric(decode, "vllm:nixl_xfer_time_seconds_count") >= 1
    wait_for(
        lambda: _usage(engines.prefill) == before, timeout_s=10, what="the prefill engine to free the pulled blocks"
    )


def test_a_pull_of_blocks_the_prefill_engine_does_not_hold_fails_at_once(engines: Engines) -> None:
    params = _prefill_leg(engines.prefill)["kv_transfer_params"]
    forged = {**params, "remote_request_id": params["remote_request_id"] + "-gone"}
    started = time.monotonic()
    response = engines.decode_fail.post("/v1/completions", json={**BODY, "kv_transfer_params": forged}, timeout=30)
    assert (response.status_code, response.json()) == (500, GENERATION_ERROR)
    assert time.monotonic() - started < 4  # the engine answered: no handshake timeout


def test_fail_policy_streams_one_error_event_once_the_dead_prefill_engines_handshake_times_out(
    engines: Engines,
) -> None:
    started = time.monotonic()
    status, events = _stream(engines.decode_fail, _decode_leg(engines.dead_prefill_params))
    assert (status, events) == (200, [GENERATION_ERROR, "[DONE]"])
    assert time.monotonic() - started >= 4.9  # vLLM's 5 s handshake timeout: ZMQ retries a refused connection


def test_fail_policy_answers_500_to_a_whole_decode_leg_of_a_dead_prefill_engine(engines: Engines) -> None:
    body = {**BODY, "kv_transfer_params": engines.dead_prefill_params}
    response = engines.decode_fail.post("/v1/completions", json=body, headers=HEADERS, timeout=30)
    assert (response.status_code, response.json()) == (500, GENERATION_ERROR)


def test_recompute_policy_answers_the_aggregated_text_when_the_prefill_engine_is_dead(
    engines: Engines, reference: str
) -> None:
    status, events = _stream(engines.decode_recompute, _decode_leg(engines.dead_prefill_params))
    assert status == 200 and events[-1] == "[DONE]", events
    assert _text(events) == reference
    assert _metric(engines.decode_recompute, "vllm:nixl_xfer_time_seconds_count") == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"kv_connector": "P2pNcclConnector", "kv_role": "kv_producer"},
            "Unsupported connector type: P2pNcclConnector",
        ),
        ({"kv_connector": "NixlConnector", "kv_role": "kv_sender"}, "Unsupported kv_role: kv_sender"),
        ({"kv_connector": "NixlConnector"}, "Please specify kv_role"),
    ],
)
def test_a_connector_or_role_vllm_does_not_know_refuses_to_start(
    tmp_path: Path, config: dict[str, str], message: str
) -> None:
    procs = Procs(tmp_path)
    try:
        proc = _spawn(procs, "refused", None, free_port(), **config)
        assert proc.wait(30) == 1
        assert message in proc.text()
    finally:
        procs.close()
