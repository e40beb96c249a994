"""LoRA adapters in the stack: each broken declaration names the key; the plan pays for the adapter slots in KV."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.capacity.plan import plan_pool
from fleet.spec.loader import parse_spec
from tests.support.stacks import assert_refused, stack_document

FILE = "stacks/Pulumi.lora.yaml"
SQL = {"name": "sql", "source": "acme/qwen-7b-sql-lora"}


def _document(adapters: Any, **overrides: Any) -> dict[str, Any]:
    return stack_document("gateway", **{"pools.0.adapters": adapters, **overrides})


def test_adapters_parse_and_their_slots_come_out_of_the_plans_kv_cache() -> None:
    spec = parse_spec(_document([SQL, {**SQL, "name": "chat", "rank": 8}]), file=FILE).spec
    pool = spec.pools[0]
    assert [(a.name, a.rank) for a in pool.adapters] == [("sql", 16), ("chat", 8)]
    without = parse_spec(_document([]), file=FILE).spec
    # One rank-16 slot of Qwen2.5-7B (~80.7 MB) at 56 KiB of KV per token: ~1,400 tokens fewer.
    lost = plan_pool(without, without.pools[0]).kv_tokens - plan_pool(spec, pool).kv_tokens
    assert 1_350 <= lost <= 1_450


BROKEN: list[tuple[str, Any, dict[str, Any], str, str]] = [
    ("duplicate name", [SQL, SQL], {}, "pools[0]", "distinct"),
    ("the pool's own name", [{**SQL, "name": "qwen2.5-7b-instruct"}], {}, "pools[0]", "served model name"),
    ("another pool's name", [{**SQL, "name": "small-model"}], {}, "pools[0].adapters[0].name", "already serves"),
    ("rank above the slots'", [{**SQL, "rank": 64}], {}, "pools[0]", "maxLoraRank"),
    ("a rank vLLM refuses", [SQL], {"pools.0.engine.maxLoraRank": 12}, "pools[0].engine.maxLoraRank", "16"),
    ("no source", [{"name": "sql"}], {}, "pools[0].adapters[0].source", "required"),
    (
        "the same adapter name in two pools",
        [SQL],
        {"pools.1.adapters": [SQL]},
        "pools[1].adapters[0].name",
        "pool 'qwen-7b' serves an adapter",
    ),
]


@pytest.mark.parametrize(("case", "adapters", "extra", "path", "allowed"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_adapter_names_the_key_and_what_is_allowed(
    case: str, adapters: Any, extra: dict[str, Any], path: str, allowed: str
) -> None:
    del case  # Unused: the id names the case.
    assert_refused(_document(adapters, **extra), FILE, path, allowed)
