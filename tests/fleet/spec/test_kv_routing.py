"""A stack that routes with kv-cache is told which pools cannot feed it (no KV events, or no tokenizer: no folder,
and on a target other than aws no model bucket to fetch the model's own from), and which scorers the least-work
picker does not read."""

from __future__ import annotations

from fleet.spec.loader import parse_spec
from tests.support.stacks import stack_document

KV_ROUTING = {"scorers": [{"name": "queue-depth", "weight": 1}, {"name": "kv-cache", "weight": 2}]}


def _warnings(preset: str = "local-sim", **overrides: object) -> list[str]:
    loaded = parse_spec(stack_document(preset, **overrides), file="Pulumi.kv.yaml")
    return [f"{w.path}: {w.message}" for w in loaded.warnings if "kv-cache" in w.message]


def test_a_pool_without_events_or_tokenizer_is_named_with_what_it_lacks() -> None:
    (warning,) = _warnings(**{"gateway.routing": KV_ROUTING})
    assert warning.startswith("llmfleet:pools[0].engine") and "engine.kvEvents or engine.tokenizer" in warning
    (only,) = _warnings(**{"gateway.routing": KV_ROUTING, "pools.0.engine.kvEvents": True})
    assert "engine.tokenizer" in only and "kvEvents" not in only.split(":", 2)[-1].split("(")[0]


def test_no_warning_when_every_pool_feeds_it_or_nothing_routes_with_it() -> None:
    fed = {"pools.0.engine.kvEvents": True, "pools.0.engine.tokenizer": "models/llmfleet-tiny-tokenizer"}
    assert _warnings(**{"gateway.routing": KV_ROUTING, **fed}) == []
    assert _warnings() == []


def test_on_aws_the_tokenizer_comes_from_the_model_bucket_so_only_kv_events_are_asked_for() -> None:
    assert _warnings("aws", **{"gateway.routing": KV_ROUTING, "pools.0.engine.kvEvents": True}) == []
    (warning,) = _warnings("aws", **{"gateway.routing": KV_ROUTING})
    assert "engine.kvEvents" in warning and "engine.tokenizer" not in warning
    on_kubernetes = {"target": "kubernetes", "gateway.tls": {"secretName": "tls"}, "images.registry": "ghcr.io/a/b"}
    (no_bucket,) = _warnings("aws", **on_kubernetes, **{"gateway.routing": KV_ROUTING, "pools.0.engine.kvEvents": True})
    assert "engine.tokenizer" in no_bucket


def test_scorers_other_than_kv_cache_under_least_work_are_named_as_having_no_effect() -> None:
    fed = {"pools.0.engine.kvEvents": True, "pools.0.engine.tokenizer": "models/llmfleet-tiny-tokenizer"}
    routing = {**KV_ROUTING, "picker": {"name": "least-work"}}
    loaded = parse_spec(stack_document("local-sim", **fed, **{"gateway.routing": routing}), file="Pulumi.kv.yaml")
    (warning,) = [f"{w.path}: {w.message}" for w in loaded.warnings if "least-work" in w.message]
    assert warning.startswith("llmfleet:gateway.routing.scorers[0]") and "'queue-depth' has no effect" in warning
    under_p2c = parse_spec(stack_document("local-sim", **fed, **{"gateway.routing": KV_ROUTING}), file="Pulumi.kv.yaml")
    assert not [w for w in under_p2c.warnings if "least-work" in w.message]
