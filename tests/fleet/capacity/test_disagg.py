"""The P/D decision, the KV link's arithmetic and both roles' sizing (`fleet.capacity.disagg`, `.disagg_plan`)."""

from __future__ import annotations

import pytest

from fleet.capacity.catalog import MODELS
from fleet.capacity.disagg import EFA_GBPS_PER_NODE, HANDSHAKE_S, TCP_GBPS, KvLink, link_gbps, should_disaggregate
from fleet.capacity.disagg_plan import Mix, size_roles, verdict
from fleet.capacity.perf import StepTimeModel, kv_bytes_per_token

QWEN = MODELS["Qwen/Qwen2.5-7B-Instruct"]
STEPS = StepTimeModel.for_names(QWEN, "a100-80gb")
ITL_S = 1 / 30


@pytest.mark.parametrize(
    ("name", "uncached", "threshold", "remote"),
    [
        ("short prompt stays aggregated", 200, 1000, False),
        ("at the threshold stays aggregated", 1000, 1000, False),
        ("one token over goes remote", 1001, 1000, True),
        ("threshold 0 sends every prompt", 1, 0, True),
        ("a fully cached prompt never goes", 0, 0, False),
    ],
)
def test_should_disaggregate(name: str, uncached: int, threshold: int, remote: bool) -> None:
    assert should_disaggregate(uncached, threshold) is remote, name


def test_qwen_kv_of_8k_tokens_crosses_100_gbit_in_the_research_files_time() -> None:
    nbytes = 8192 * kv_bytes_per_token(QWEN)
    assert nbytes == 469_762_048  # 448 MiB (research file 4.1)
    assert KvLink(100.0).wire_seconds(nbytes) == pytest.approx(0.0376, abs=1e-4)  # 37.6 ms (4.2)


def test_transfer_is_bytes_over_the_link_plus_the_handshake_on_first_contact() -> None:
    link = KvLink(50.0, handshake_s=HANDSHAKE_S)
    assert link.transfer_seconds(1e9, first_contact=False) == pytest.approx(8e9 / 50e9)
    assert link.transfer_seconds(1e9, first_contact=True) == pytest.approx(8e9 / 50e9 + HANDSHAKE_S)


def test_a_replica_gets_its_gpus_share_of_the_nodes_efa() -> None:
    assert EFA_GBPS_PER_NODE["p4de.24xlarge"] == 400.0
    assert link_gbps("p4de.24xlarge", 1) == 50.0
    assert link_gbps("p4de.24xlarge", 8) == 400.0
    assert link_gbps("g6e.xlarge", 1) == TCP_GBPS
    assert link_gbps(None, 1) == TCP_GBPS


def _mix(prompt: float, output: float, qps: float, threshold: int = 1000) -> Mix:
    remote = prompt > threshold
    return Mix(qps, prompt, output, 1.0 if remote else 0.0, prompt if remote else 0.0, 0.0 if remote else prompt)


def _sized(mix: Mix) -> tuple[int, int, int]:
    s = size_roles(STEPS, mix, 0.3, ITL_S, KvLink(50.0), kv_bytes_per_token(QWEN), 2048, 256)
    return s.prefill, s.decode, s.aggregated


def test_prefill_replicas_grow_with_a_tighter_ttft_target() -> None:
    mix = _mix(2000, 100, 10)
    loose = size_roles(STEPS, mix, 1.0, ITL_S, KvLink(50.0), kv_bytes_per_token(QWEN), 2048, 256)
    tight = size_roles(STEPS, mix, 0.3, ITL_S, KvLink(50.0), kv_bytes_per_token(QWEN), 2048, 256)
    assert tight.prefill > loose.prefill >= 1
    assert tight.decode == loose.decode  # the inter-token target sizes decode alone


def test_short_prompts_do_not_pay_and_say_why() -> None:
    mix = _mix(200, 80, 200)
    prefill, decode, aggregated = _sized(mix)
    assert prefill == 0 and decode == aggregated
    found = verdict(
        size_roles(STEPS, mix, 0.3, ITL_S, KvLink(50.0), kv_bytes_per_token(QWEN), 2048, 256), mix, ITL_S, 1000
    )
    assert not found.pays and found.reasons[0].startswith("does not pay: no prompt's uncached tokens")


def test_long_prompts_under_a_tight_inter_token_target_pay() -> None:
    mix = _mix(2000, 200, 20)
    s = size_roles(STEPS, mix, 0.3, ITL_S, KvLink(50.0), kv_bytes_per_token(QWEN), 2048, 256)
    assert s.aggregated_itl_p99_s > ITL_S > s.decode_itl_s  # a prefill chunk stalls an aggregated decode step
    found = verdict(s, mix, ITL_S, 1000)
    assert found.pays and s.prefill + s.decode < s.aggregated, found.reasons
