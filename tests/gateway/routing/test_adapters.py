"""serves-adapter and adapter-affinity: an adapter's requests reach only replicas serving it, preferring one
that holds it."""

from __future__ import annotations

from gateway.endpoints import served_adapters
from gateway.routing.filters.adapter import ServesAdapter
from gateway.routing.scorers.adapter import AdapterAffinity
from tests.gateway.builders import endpoint, request

OLD = endpoint("old")  # started before the adapter was added
NEW = endpoint("new", adapters=frozenset({"sql", "chat"}))
BUSY = endpoint("busy", adapters=frozenset({"sql", "chat"}), active_adapters=frozenset({"sql"}))


def test_an_adapter_request_keeps_only_replicas_that_serve_it_and_a_base_request_keeps_all() -> None:
    assert ServesAdapter().filter([OLD, NEW, BUSY], request(adapter="sql")) == [NEW, BUSY]
    assert ServesAdapter().filter([OLD], request(adapter="sql")) == []
    assert ServesAdapter().filter([OLD, NEW], request()) == [OLD, NEW]


def test_affinity_scores_the_replica_whose_engine_runs_the_adapter() -> None:
    scorer = AdapterAffinity()
    assert scorer.score([NEW, BUSY], request(adapter="sql")) == [0.0, 1.0]
    assert scorer.score([NEW, BUSY], request(adapter="chat")) == [0.0, 0.0]
    assert scorer.score([NEW, BUSY], request()) == [0.0, 0.0]


def test_affinity_remembers_where_this_gateway_sent_an_adapter_for_resident_s() -> None:
    scorer = AdapterAffinity(AdapterAffinity.Params(resident_s=60))
    scorer.observe(request(adapter="chat", now=100.0), NEW)
    assert scorer.score([NEW, BUSY], request(adapter="chat", now=159.0)) == [1.0, 0.0]
    assert scorer.score([NEW, BUSY], request(adapter="chat", now=161.0)) == [0.0, 0.0]  # likely pushed out since


def test_a_models_list_gives_the_adapters_on_the_base_and_anything_else_is_read_again() -> None:
    listing = '{"data": [{"id": "qwen", "parent": null}, {"id": "sql", "parent": "qwen"}, {"id": "x", "parent": "y"}]}'
    assert served_adapters(listing, "qwen") == frozenset({"sql"})
    assert served_adapters("Service Unavailable", "qwen") is None  # not yet known: the next probe reads it again
