"""Image pins in stack files: cloud stacks name their images by digest, and `llmfleet validate` says how to get one."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.spec.errors import Problem, SpecError
from fleet.spec.loader import list_stacks, load_spec, parse_spec
from fleet.spec.placeholders import PLACEHOLDER_DIGEST
from tests.support.stacks import DELETE, stack_document

DIGEST = "sha256:" + "a" * 64


def _problems(overrides: dict[str, Any], preset: str = "aws") -> list[Problem]:
    """Every problem (errors, else warnings) of the preset with ``overrides``."""
    try:
        return parse_spec(stack_document(preset, **overrides), name=preset).warnings
    except SpecError as error:
        return error.problems


@pytest.mark.parametrize("stack", [s for s in list_stacks() if load_spec(s).spec.target != "local"])
def test_every_shipped_cloud_stack_pins_its_runtime_image(stack: str) -> None:
    images = load_spec(stack).spec.images
    assert images.runtime_digest is not None and images.runtime_digest.startswith("sha256:")


BROKEN: list[tuple[str, dict[str, Any], str, str]] = [
    ("aws without a runtime digest", {"images.runtimeDigest": DELETE}, "runtimeDigest", "pulumi config set"),
    ("a vLLM pool without an engine digest", {"images.engineDigest": DELETE}, "engineDigest", "pools[0]"),
    ("a tag where a digest goes", {"images.runtimeDigest": "v0.1.0"}, "runtimeDigest", "pattern"),
    ("a short digest", {"images.engineDigest": "sha256:abc"}, "engineDigest", "pattern"),
    ("a registry on aws", {"images.registry": "ghcr.io/acme"}, "registry", "ECR"),
    ("kubernetes without a registry", {"target": "kubernetes"}, "registry", "required on target kubernetes"),
    ("a registry with a tag", {"target": "kubernetes", "images.registry": "ghcr.io/a:1"}, "registry", "pattern"),
]


@pytest.mark.parametrize(("case", "overrides", "path", "says"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_pin_is_an_error_naming_the_key_and_the_fix(
    case: str, overrides: dict[str, Any], path: str, says: str
) -> None:
    del case  # Unused: the id names the case.
    with pytest.raises(SpecError) as caught:
        parse_spec(stack_document("aws", **overrides), file="Pulumi.prod.yaml", name="prod")
    (problem,) = [p for p in caught.value.problems if p.path == f"llmfleet:images.{path}"]
    assert says in problem.message
    assert problem.file == "Pulumi.prod.yaml"


def test_the_missing_digest_error_says_how_to_build_and_pin_it() -> None:
    (problem,) = _problems({"images.runtimeDigest": DELETE})
    assert "images/build.sh runtime" in problem.message
    assert "pulumi config set --path 'llmfleet:images.runtimeDigest' sha256:... -s prod" in problem.message


def test_only_pools_running_vllm_need_an_engine_digest() -> None:
    simulated = {"images.engineDigest": DELETE, "pools.0.engine.kind": "sim"}
    assert [p for p in _problems(simulated) if p.path.startswith("llmfleet:images")] == []


def test_a_kubernetes_stack_with_a_registry_and_a_runtime_digest_is_valid() -> None:
    overrides = {
        "target": "kubernetes",
        "images.registry": "registry.local:5000/llmfleet",
        "gateway.tls": {"secretName": "gateway-tls"},
    }
    assert _problems(overrides) == []


def test_a_local_stack_needs_no_image() -> None:
    assert _problems({}, preset="local") == []


def test_a_placeholder_digest_is_a_warning_not_an_error() -> None:
    (warning,) = _problems({"images.runtimeDigest": PLACEHOLDER_DIGEST})
    assert warning.level == "warning" and warning.path == "llmfleet:images.runtimeDigest"
    assert "placeholder" in warning.message
