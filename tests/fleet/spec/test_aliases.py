"""The stack's ``aliases`` section: a valid one parses; each broken one names the file, the key and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.spec.loader import parse_spec
from tests.support.stacks import MODEL, assert_refused, stack_document

FILE = "stacks/Pulumi.canary.yaml"
# The gateway preset's pools (qwen-7b serving MODEL, small serving small-model) and a canary of qwen-7b.
CANARY_POOL = {
    "name": "qwen-7b-v2",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "servedModelName": "qwen2.5-7b-instruct-v2",
    "engine": {"kind": "sim", "maxNumSeqs": 8},
    "replicas": {"min": 1, "max": 2},
}


def _document(aliases: Any, **overrides: Any) -> dict[str, Any]:
    pools = [*stack_document("gateway")["config"]["llmfleet:pools"], CANARY_POOL]
    return stack_document("gateway", **{"pools": pools, "aliases": aliases, **overrides})


def test_an_alias_with_weights_a_fallback_and_stickiness_parses() -> None:
    aliases = {"chat": {"pools": {"qwen-7b": 95, "qwen-7b-v2": 5}, "fallback": "small", "sticky": "none"}}
    loaded = parse_spec(_document(aliases, **{"tenants.1.allowedModels": ["chat"]}), file=FILE)
    chat = loaded.spec.aliases["chat"]
    assert (chat.pools, chat.fallback, chat.sticky) == ({"qwen-7b": 95, "qwen-7b-v2": 5}, "small", "none")
    assert parse_spec(_document({"chat": {"pools": {"qwen-7b": 1}}}), file=FILE).spec.aliases["chat"].sticky == (
        "session"
    )


def test_an_alias_may_take_the_name_of_a_pool_it_includes() -> None:
    loaded = parse_spec(_document({MODEL: {"pools": {"qwen-7b": 95, "qwen-7b-v2": 5}}}), file=FILE)
    assert loaded.spec.aliases[MODEL].pools["qwen-7b-v2"] == 5


def test_an_aliass_rollout_settings_parse_and_default() -> None:
    rollout = {"steps": [10, 50, 100], "bakeS": 3, "minSamples": 20, "baseline": "qwen-7b", "baselineAfter": "min"}
    aliases = {
        "chat": {"pools": {"qwen-7b": 100, "qwen-7b-v2": 0}, "rollout": rollout},
        "other": {"pools": {"small": 1}},
    }
    spec = parse_spec(_document(aliases), file=FILE).spec
    chat = spec.aliases["chat"].rollout
    assert (chat.steps, chat.bake_s, chat.min_samples, chat.baseline, chat.baseline_after) == (
        [10, 50, 100],
        3.0,
        20,
        "qwen-7b",
        "min",
    )
    default = spec.aliases["other"].rollout
    assert (default.steps, default.bake_s, default.min_samples, default.tolerance) == (
        [1, 5, 25, 50, 100],
        300,
        100,
        0.1,
    )


# (case, aliases, extra overrides, expected key path, fragment of the message saying what is allowed)
BROKEN: list[tuple[str, Any, dict[str, Any], str, str]] = [
    ("unknown pool", {"chat": {"pools": {"qwen-7b": 95, "qwen-9b": 5}}}, {}, "aliases.chat.pools.qwen-9b", "pools:"),
    (
        "negative weight",
        {"chat": {"pools": {"qwen-7b": -1}}},
        {},
        "aliases.chat.pools.qwen-7b",
        "greater than or equal to 0",
    ),
    ("fractional weight", {"chat": {"pools": {"qwen-7b": 2.5}}}, {}, "aliases.chat.pools.qwen-7b", "integer"),
    ("weight as text", {"chat": {"pools": {"qwen-7b": "95"}}}, {}, "aliases.chat.pools.qwen-7b", "integer"),
    ("weights sum to zero", {"chat": {"pools": {"qwen-7b": 0}}}, {}, "aliases.chat.pools", "positive weight"),
    ("no pools", {"chat": {"pools": {}}}, {}, "aliases.chat.pools", "at least 1"),
    ("unknown fallback", {"chat": {"pools": {"qwen-7b": 1}, "fallback": "big"}}, {}, "aliases.chat.fallback", "pools:"),
    (
        "fallback among the weighted pools",
        {"chat": {"pools": {"qwen-7b": 1, "small": 1}, "fallback": "small"}},
        {},
        "aliases.chat.fallback",
        "outside them",
    ),
    (
        "shadowing another pool's served name",
        {"small-model": {"pools": {"qwen-7b": 1}}},
        {},
        "aliases.small-model",
        "only when its pools include that pool",
    ),
    (
        "shadowing another pool's model id",
        {"Qwen/Qwen2.5-7B-Instruct": {"pools": {"small": 1}}},
        {},
        "aliases.Qwen/Qwen2.5-7B-Instruct",
        "only when its pools include that pool",
    ),
    ("unknown stickiness", {"chat": {"pools": {"qwen-7b": 1}, "sticky": "user"}}, {}, "aliases.chat.sticky", "'none'"),
    (
        "misspelt key",
        {"chat": {"pools": {"qwen-7b": 1}, "fallbak": "small"}},
        {},
        "aliases.chat.fallbak",
        "did you mean 'fallback'? allowed keys: fallback, pools, rollout, sticky",
    ),
    ("name with a space", {"my chat": {"pools": {"qwen-7b": 1}}}, {}, "aliases.my chat", "pattern"),
    (
        "rollout steps that go down",
        {"chat": {"pools": {"qwen-7b": 1}, "rollout": {"steps": [10, 5, 100]}}},
        {},
        "aliases.chat.rollout.steps",
        "each step above the one before",
    ),
    (
        "rollout steps short of 100",
        {"chat": {"pools": {"qwen-7b": 1}, "rollout": {"steps": [10, 50]}}},
        {},
        "aliases.chat.rollout.steps",
        "ending at 100",
    ),
    (
        "rollout baseline outside the alias",
        {"chat": {"pools": {"qwen-7b": 1}, "rollout": {"baseline": "small"}}},
        {},
        "aliases.chat",
        "rollout.baseline 'small' is not one of the alias's pools",
    ),
    (
        "rollout tolerance of 100%",
        {"chat": {"pools": {"qwen-7b": 1}, "rollout": {"tolerance": 1.0}}},
        {},
        "aliases.chat.rollout.tolerance",
        "less than 1",
    ),
    (
        "rollout judged on an unknown metric",
        {"chat": {"pools": {"qwen-7b": 1}, "rollout": {"metrics": ["ttftP50"]}}},
        {},
        "aliases.chat.rollout.metrics[0]",
        "'ttftP99', 'tpotP99' or 'errorRate'",
    ),
    (
        "an embedding pool behind a chat alias",
        {"chat": {"pools": {"qwen-7b": 95, "qwen-7b-v2": 5}}},
        {"pools.2.engine.runner": "pooling"},
        "aliases.chat",
        "its pools mix engine runners: qwen-7b (generate), qwen-7b-v2 (pooling)",
    ),
    (
        "tenant allowed an unknown alias",
        {"chat": {"pools": {"qwen-7b": 1}}},
        {"tenants.1.allowedModels": ["chit"]},
        "tenants[1].allowedModels[0]",
        "no pool or alias serves it",
    ),
]


@pytest.mark.parametrize(("case", "aliases", "extra", "path", "allowed"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_alias_names_the_file_the_key_and_what_is_allowed(
    case: str, aliases: Any, extra: dict[str, Any], path: str, allowed: str
) -> None:
    del case  # Unused: the id names the case.
    assert_refused(_document(aliases, **extra), FILE, path, allowed)


def test_a_weighted_pool_that_can_scale_to_zero_is_a_warning() -> None:
    loaded = parse_spec(_document({"chat": {"pools": {"qwen-7b": 95, "small": 5}}}), file=FILE)
    assert [w.path for w in loaded.warnings if "replicas.min is 0" in w.message] == [
        "llmfleet:aliases.chat.pools.small"
    ]


def test_a_canary_sized_like_the_whole_alias_is_a_warning() -> None:
    aliases = {"chat": {"pools": {"qwen-7b": 95, "qwen-7b-v2": 5}}}
    split = {"pools.0.workload.peakQps": 1.9, "pools.2.workload.peakQps": 0.1}
    assert not [w for w in parse_spec(_document(aliases, **split), file=FILE).warnings if "alias" in w.message]
    copied = {"pools.0.workload.peakQps": 2, "pools.2.workload.peakQps": 2}
    warnings = parse_spec(_document(aliases, **copied), file=FILE).warnings
    # Of 4 QPS, qwen-7b's share is 3.8 (2 is within a factor of 2) and the canary's 0.2 (2 is ten times it).
    assert [w.path for w in warnings if "share of the alias's peak" in w.message] == [
        "llmfleet:aliases.chat.pools.qwen-7b-v2"
    ]
