"""LoRA adapters in the simulator: vLLM's flags, the models list, load costs in TTFT, KV reserved for slots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_sim.config import num_gpu_blocks
from engine_sim.errors import ConfigError
from engine_sim.lora import AdapterResidency, LoraSettings, parse_lora_modules
from fleet.capacity.catalog import MODELS
from fleet.capacity.lora import adapter_bytes, disk_load_seconds, lora_slot_bytes, swap_in_seconds
from tests.engine_sim.builders import QWEN_7B, make_config
from tests.engine_sim.conftest import StartSim

FACTS = MODELS[QWEN_7B]
DISK, SWAP = disk_load_seconds(FACTS, 16), swap_in_seconds(FACTS, 16)


def settings(*names: str, max_loras: int = 2, max_cpu_loras: int | None = 3) -> LoraSettings:
    return LoraSettings(tuple((n, f"/adapters/{n}", 16) for n in names), max_loras, 16, max_cpu_loras)


def test_an_adapter_is_read_from_disk_once_then_costs_nothing_while_it_stays_on_the_gpu() -> None:
    where = AdapterResidency(settings("a", "b"), FACTS)
    assert where.ready_in("a", 0.0) == pytest.approx(DISK + SWAP)
    assert where.ready_in("a", 0.01) == pytest.approx(DISK + SWAP - 0.01)  # a second request waits for that load
    assert where.ready_in("a", 10.0) == 0.0
    assert where.loads_from_disk == 1


def test_the_least_recently_used_adapter_leaves_the_gpu_and_comes_back_from_host_memory() -> None:
    where = AdapterResidency(settings("a", "b", "c"), FACTS)
    for name in ("a", "b", "c"):  # two GPU slots: c evicts a from the GPU, host memory keeps all three
        where.ready_in(name, 0.0)
    assert where.on_gpu == ("b", "c")
    assert where.ready_in("a", 10.0) == pytest.approx(SWAP)
    assert (where.loads_from_disk, where.swaps_in) == (3, 1)


def test_an_adapter_dropped_from_host_memory_is_read_from_disk_again() -> None:
    where = AdapterResidency(settings("a", "b", "c", max_loras=1, max_cpu_loras=2), FACTS)
    for name in ("a", "b", "c"):
        where.ready_in(name, 0.0)
    assert where.ready_in("a", 10.0) == pytest.approx(DISK + SWAP)


def test_lora_slots_take_their_memory_from_the_kv_cache() -> None:
    plain = num_gpu_blocks(make_config())
    with_slots = num_gpu_blocks(make_config(lora=settings("a", max_loras=4)))
    per_block = 2 * FACTS.layers * FACTS.kv_heads * FACTS.head_dim * 2 * 16
    assert plain - with_slots == pytest.approx(lora_slot_bytes(FACTS, 4, 16) / per_block, abs=1)
    assert adapter_bytes(FACTS, 16) == pytest.approx(80.7e6, rel=0.01)  # rank 16 on every projection of Qwen2.5-7B


def test_lora_module_flags_take_vllms_two_forms_and_read_the_rank_from_the_adapter(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8}))
    lora = parse_lora_modules(["sql=/a/sql", json.dumps({"name": "chat", "path": str(tmp_path)})], 2, 16, None)
    assert lora.modules == (("sql", "/a/sql", 16), ("chat", str(tmp_path), 8))


@pytest.mark.parametrize(
    ("values", "max_rank", "message"),
    [
        (["sql"], 16, "expected name=path"),
        (["a=/x", "a=/y"], 16, "duplicate names"),
        (['{"name": "a"}'], 16, "needs 'name' and 'path'"),
        (["a=/x"], 12, "--max-lora-rank 12"),
    ],
)
def test_bad_lora_flags_are_refused_at_start_up(values: list[str], max_rank: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_lora_modules(values, 1, max_rank, None)


async def test_an_adapter_is_listed_served_and_its_first_load_counts_in_ttft(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=1.0, lora=settings("sql", "chat"))
    models = (await sim.client.get("/v1/models")).json()["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in models[1:]] == [
        ("sql", "qwen", "/adapters/sql"),
        ("chat", "qwen", "/adapters/chat"),
    ]
    body = {"model": "sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    first = await sim.client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200 and first.json()["model"] == "sql"
    second = await sim.client.post("/v1/chat/completions", json=body)
    assert second.status_code == 200
    assert sim.engine.adapters is not None and sim.engine.adapters.loads_from_disk == 1
    text = await sim.metrics_text()
    assert 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}' in text
    # The disk load (~60 ms) is in the first request's TTFT only: the histogram's sum grows by at least that.
    ttft_sum = next(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:time_to_first_token_seconds_sum")
    )
    assert ttft_sum >= DISK
    unknown = await sim.client.post("/v1/chat/completions", json={**body, "model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"
