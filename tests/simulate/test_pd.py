"""Prefill/decode disaggregation in the simulator (`simulate.pd_sim`, `simulate.pd`): the decision keeps short
prompts aggregated, each transfer costs its bytes over the link plus the handshake on a pair's first contact, and
at equal paid GPU-hours the split pays on long prompts under a tight inter-token target and not on short ones."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fleet.capacity.disagg import KvLink
from fleet.capacity.perf import kv_bytes_per_token
from fleet.capacity.plan import model_facts
from llmfleet.cli import main
from simulate.configs import stack_config
from simulate.pd import PdConfig, pd_row, run_pd
from simulate.pd_sim import PdResult
from simulate.replay import Prepared, _spec, prepare
from simulate.trace import TraceRequest
from tests.support.stacks import write_stack

LINK = KvLink(50.0, handshake_s=5.0)  # a TP1 replica's share of a p4de's 4 x 100 Gbit/s EFA


def _trace(prompt: int, output: int, qps: float, end_s: float, seed: int = 1) -> list[TraceRequest]:
    """Poisson arrivals of prompts around ``prompt`` tokens (sd a fifth) and answers around ``output``."""
    rng, t = random.Random(seed), 0.0
    out: list[TraceRequest] = []
    while True:
        t += rng.expovariate(qps)
        if t >= end_s:
            return out
        p = max(16, round(rng.gauss(prompt, prompt / 5)))
        out.append(TraceRequest(t, f"r{len(out)}", p, max(4, round(rng.gauss(output, output / 4)))))


def _run(prepared: Prepared, decode: int, prefill: int = 0, threshold: int = 1000, link: KvLink = LINK) -> PdResult:
    routing = stack_config(_spec(prepared.stack)).routing
    return run_pd(prepared, PdConfig(routing, decode, prefill, threshold), seed=7, link=link)


def test_the_threshold_keeps_short_prompts_aggregated() -> None:
    short = [TraceRequest(i * 0.5, f"s{i}", 300, 20) for i in range(10)]
    long = [TraceRequest(i * 0.5 + 0.25, f"l{i}", 3000, 20) for i in range(10)]
    prepared = prepare("prod", sorted([*short, *long], key=lambda r: r.t))
    result = _run(prepared, decode=1, prefill=1, threshold=1000)
    assert result.disaggregated == 10 and result.completed == 20
    assert len(result.transfer_s) == 10
    everything = _run(prepared, decode=1, prefill=1, threshold=0)
    assert everything.disaggregated == 20


def test_each_transfer_is_its_bytes_over_the_link_plus_the_handshake_on_first_contact() -> None:
    # Far apart, so no transfer waits for another on the link: the first pays the handshake, the rest only bytes.
    trace = [TraceRequest(i * 10.0, f"r{i}", 4000 + 16 * i, 8) for i in range(3)]
    prepared = prepare("prod", trace)
    result = _run(prepared, decode=1, prefill=1, threshold=0)
    per_token = kv_bytes_per_token(model_facts(prepared.pool))
    wires = [LINK.wire_seconds(r.prompt_tokens * per_token) for r in trace]
    assert result.handshakes == 1
    assert list(result.transfer_s) == pytest.approx([wires[0] + 5.0, wires[1], wires[2]])
    assert result.transfer_bytes == sum(r.prompt_tokens * per_token for r in trace)
    assert result.recomputed == 0 and result.completed == 3


def test_long_prompts_under_a_tight_itl_target_pay_at_equal_gpu_hours(tmp_path: Path) -> None:
    # TaiChi's case for the split: strict inter-token (prod's 30 tokens/s), relaxed TTFT (2 s: 4000-token prompts
    # take 300 ms to prefill alone, prod's 300 ms TTFT target is out of reach for both pools).
    stack = write_stack(tmp_path / "Pulumi.pd-relaxed.yaml", "prod", **{"pools.0.slo.ttftP99Ms": 2000})
    prepared = prepare(str(stack), _trace(4000, 150, 6.0, 60.0))
    aggregated = pd_row(_run(prepared, decode=3), prepared)
    split = pd_row(_run(prepared, decode=1, prefill=2), prepared)
    assert split["paid_gpu_h"] == aggregated["paid_gpu_h"]
    # Prefill chunks of 2048 tokens stall the aggregated replicas' decode steps; the decode replica never runs one.
    assert float(aggregated["itl_p99"]) > 1 / 30 > float(split["itl_p99"])
    assert float(split["itl_in_slo"]) > float(aggregated["itl_in_slo"])
    assert float(split["good"]) > float(aggregated["good"])


def test_short_prompts_do_not_pay_at_equal_gpu_hours() -> None:
    prepared = prepare("prod", _trace(200, 80, 100.0, 30.0))
    aggregated = pd_row(_run(prepared, decode=3), prepared)
    split_result = _run(prepared, decode=2, prefill=1)
    split = pd_row(split_result, prepared)
    assert split_result.disaggregated == 0  # every prompt under the threshold: the prefill replica idles
    assert split["paid_gpu_h"] == aggregated["paid_gpu_h"]
    assert float(split["good"]) < float(aggregated["good"])


def test_simulate_compare_pd_prints_both_pools_and_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "long.jsonl"
    lines = [
        f'{{"t": {r.t}, "prompt_tokens": {r.prompt_tokens}, "output_tokens": {r.output_tokens}}}'
        for r in _trace(3000, 100, 4.0, 30.0)
    ]
    trace.write_text("\n".join(lines) + "\n")
    args = ["simulate", "--stack", "prod", "--trace", str(trace), "--compare", "pd", "--pd-threshold", "512,2048"]
    assert main([*args, "--fixed", "4", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "aggregated 4 " in out and ">512 " in out and ">2048 " in out
    assert "at 4 replicas disaggregation" in out
    assert main([*args[:-1], "12x"]) == 2
    assert "--pd-threshold 12x: give token counts" in capsys.readouterr().err
    assert main([*args, "--plot", str(tmp_path / "pd.png")]) == 2
    assert "--compare pd runs its own rows" in capsys.readouterr().err
