"""Images under mocks: an aws stack owns its ECR repositories, and every workload runs a digest from the stack's
registry."""

from __future__ import annotations

import json

import pytest

from fleet.protocol import contract
from fleet.spec.loader import list_stacks, load_spec
from infra.images import KEEP_UNTAGGED, ImageRefs, image_refs
from infra.offline import OfflineRun
from policies.images import workload_images
from tests.infra.conftest import stack_run
from tests.support.stacks import spec

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]
AWS_STACKS = [s for s in CLOUD_STACKS if load_spec(s).spec.target == "aws"]
REPOSITORY = "aws:ecr/repository:Repository"
DEVICE_PLUGIN_DIGEST = contract.DEVICE_PLUGIN_SOURCE.partition("@")[2]


def images_by_workload(run: OfflineRun) -> dict[str, list[str]]:
    """Workload (``<component>/<name>``) -> the distinct images of its containers and init containers."""
    found: dict[str, list[str]] = {}
    for resource in run.resources:
        images = list(workload_images(resource.type, resource.props))
        if images:
            meta = resource.props["metadata"]
            found[f"{meta['labels'].get(contract.LABEL_COMPONENT, '?')}/{meta['name']}"] = list(dict.fromkeys(images))
    return found


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_aws_stack_owns_an_immutable_scanned_encrypted_repository_per_image(stack: str) -> None:
    run = stack_run(stack)
    environment = load_spec(stack).spec.environment
    repositories = run.of_type(REPOSITORY)
    names = {contract.image_repository_name(environment, image) for image in contract.IMAGES}
    assert {r.props["name"] for r in repositories} == names
    for repository in repositories:
        assert repository.props["imageTagMutability"] == "IMMUTABLE"
        assert repository.props["imageScanningConfiguration"] == {"scanOnPush": True}
        assert repository.props["encryptionConfigurations"] == [{"encryptionType": "KMS"}]
    lifecycle = run.of_type("aws:ecr/lifecyclePolicy:LifecyclePolicy")
    assert {p.props["repository"] for p in lifecycle} == names
    for policy in lifecycle:
        (rule,) = json.loads(policy.props["policy"])["rules"]
        assert rule["selection"] == {
            "tagStatus": "untagged",
            "countType": "imageCountMoreThan",
            "countNumber": KEEP_UNTAGGED,
        }
        assert rule["action"] == {"type": "expire"}
    urls = {r.props["repositoryUrl"] for r in repositories}
    assert urls == {f"{run.outputs['imageRegistry']}/{image}" for image in contract.IMAGES}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_workload_runs_the_stacks_digest_from_the_stacks_registry(stack: str) -> None:
    run = stack_run(stack)
    spec = load_spec(stack).spec
    registry = run.outputs["imageRegistry"]
    runtime = f"{registry}/{contract.IMAGE_RUNTIME}@{spec.images.runtime_digest}"
    expected = {
        f"{contract.COMPONENT_GATEWAY}/{contract.GATEWAY_NAME}": [runtime],
        f"{contract.COMPONENT_CONTROL_PLANE}/{contract.CONTROL_PLANE_NAME}": [runtime],
    }
    for pool in spec.pools:
        engine = f"{registry}/{contract.IMAGE_ENGINE}@{spec.images.engine_digest}"
        name = f"{contract.COMPONENT_ENGINE}/{contract.pool_deployment_name(pool.name)}"
        expected[name] = [engine if pool.runs_engine_image else runtime]
    if spec.target == "aws":
        device_plugin = f"{registry}/{contract.IMAGE_DEVICE_PLUGIN}@{DEVICE_PLUGIN_DIGEST}"
        expected[f"{contract.COMPONENT_DEVICE_PLUGIN}/nvidia-device-plugin"] = [device_plugin]
    found = images_by_workload(run)
    assert {name: found.get(name) for name in expected} == expected
    for images in found.values():  # and every other workload the program declares
        assert all(image.startswith(f"{registry}/") and "@sha256:" in image for image in images), images


def test_prod_runs_vllm_from_the_engine_image_and_dev_simulates_on_the_runtime_image() -> None:
    prod = images_by_workload(stack_run("prod"))
    dev = images_by_workload(stack_run("dev"))
    (prod_engine,) = prod[f"{contract.COMPONENT_ENGINE}/llmfleet-qwen-7b"]
    (dev_engine,) = dev[f"{contract.COMPONENT_ENGINE}/llmfleet-qwen-7b"]
    assert prod_engine.startswith("000000000000.dkr.ecr.us-east-1.amazonaws.com/llmfleet-prod/engine@sha256:")
    assert dev_engine.startswith(f"{load_spec('dev').spec.images.registry}/runtime@sha256:")


def test_a_kubernetes_stack_without_ecr_creates_no_repository() -> None:
    assert stack_run("dev").of_type(REPOSITORY) == []


def test_image_refs_refuse_a_stack_without_the_pins_they_need() -> None:
    with pytest.raises(ValueError, match="llmfleet:images.registry"):
        image_refs(spec("aws"))  # neither ECR repositories nor a registry
    # What validation refuses (a vLLM pool, no engine digest), the program refuses too.
    refs = ImageRefs(runtime="registry.example/runtime@sha256:" + "1" * 64, engine=None, device_plugin="unused")
    simulated, vllm = spec("aws", **{"pools.0.engine.kind": "sim"}).pools[0], spec("aws").pools[0]
    assert refs.for_pool(simulated) == refs.runtime
    with pytest.raises(ValueError, match="engineDigest"):
        refs.for_pool(vllm)
