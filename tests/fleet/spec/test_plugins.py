"""The plugin registry: names listed on a miss, one class per name, camelCase parameters validated with key paths;
the core loads a stack without importing any component."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest
from pydantic import Field

from fleet.spec.plugins import KINDS, BadParams, PluginParams, Registry, UnknownPlugin
from llmfleet.registries import all_registries

EXPECTED = {
    "routing filter": {"ready", "serves-model", "not-ejected", "fresh-metrics"},
    "routing scorer": {"queue-depth", "kv-usage", "in-flight", "prefix-affinity", "session-affinity"},
    "routing picker": {"p2c", "random", "round-robin", "max-score"},
    "scaling policy": {"target-tracking", "threshold"},
    "actuator": {"local", "kubernetes", "aws"},
    "engine kind": {"vllm", "sim"},
}


def test_every_kind_has_one_registry_with_the_shipped_plugins() -> None:
    registries = {r.kind: r for r in all_registries()}
    assert sorted(registries) == sorted(KINDS)
    for kind, names in EXPECTED.items():
        assert names <= set(registries[kind].names()), kind


class Widget:
    name: ClassVar[str]

    def __init__(self, params: PluginParams) -> None:
        self.params = params


class Knob(Widget):
    class Params(PluginParams):
        max_age_s: float = Field(default=5.0, gt=0)
        seed: int | None = None


def _registry() -> Registry[Widget]:
    registry: Registry[Widget] = Registry("routing filter")
    registry.register("knob", Knob)
    registry.register("plain", Widget)
    return registry


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(UnknownPlugin, match="unknown routing filter 'knb'; registered: knob, plain"):
        _registry().get("knb")


def test_a_taken_name_is_refused_for_another_class() -> None:
    registry = _registry()
    with pytest.raises(ValueError, match="already registered by Knob"):
        registry.register("knob", Widget)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="kinds: routing filter"):
        Registry("routing filtre")


def test_create_builds_the_plugin_from_camel_case_parameters() -> None:
    knob = _registry().create("knob", {"maxAgeS": 2, "seed": 7})
    assert isinstance(knob, Knob)
    assert knob.params == Knob.Params(max_age_s=2, seed=7)
    assert knob.name == "knob"


@pytest.mark.parametrize(
    ("case", "raw", "path", "message"),
    [
        ("snake_case spelling", {"max_age_s": 2}, "llmfleet:x.params.max_age_s", "keys are camelCase: use 'maxAgeS'"),
        ("typo", {"maxAgeSec": 2}, "llmfleet:x.params.maxAgeSec", "did you mean 'maxAgeS'?"),
        ("out of range", {"maxAgeS": -1}, "llmfleet:x.params.maxAgeS", "greater than 0"),
        ("wrong type", {"seed": "seven"}, "llmfleet:x.params.seed", "valid integer"),
    ],
)
def test_bad_parameters_name_the_key_path(case: str, raw: dict[str, object], path: str, message: str) -> None:
    del case  # Unused: the id names the case.
    with pytest.raises(BadParams) as caught:
        _registry().parse_params("knob", raw, "x.params")
    [problem] = caught.value.problems
    assert problem.path == path
    assert message in problem.message


def test_a_plugin_without_parameters_refuses_any() -> None:
    problems = _registry().check("plain", {"speed": 1}, "x.name", "x.params")
    assert [(p.path, p.message) for p in problems] == [("llmfleet:x.params.speed", "unknown key; allowed keys: none")]


def test_check_reports_an_unknown_name_at_its_path() -> None:
    [problem] = _registry().check("nope", {}, "gateway.routing.filters[2].name", "gateway.routing.filters[2].params")
    assert problem.path == "llmfleet:gateway.routing.filters[2].name"
    assert problem.value == "nope"


def test_loading_a_stack_imports_no_component() -> None:
    # A fresh interpreter: this test process has imported every component already.
    code = (
        "import sys\n"
        "from fleet.spec.loader import load_spec\n"
        "for name in ('local', 'dev', 'staging', 'prod'):\n"
        "    load_spec(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'gateway', 'agent', 'autoscaler', 'engine_sim', 'infra', 'policies', 'pulumi'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
