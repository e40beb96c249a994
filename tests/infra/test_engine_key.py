"""The engines' API key on the cluster: one Secret, mounted as a file in engine and gateway containers only, never
inlined and never in env."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pulumi
import pytest

from fleet.protocol import contract
from fleet.protocol.control_auth import ENGINE_API_KEY_ENV
from fleet.spec.loader import list_stacks, load_spec
from infra.config import ENGINE_API_KEY_CONFIG
from infra.k8s_base import ENGINE_API_KEY_FILE
from infra.offline import run_offline
from infra.stack_run import PLACEHOLDER_ENGINE_API_KEY, offline_config
from tests.infra.conftest import stack_run
from tests.support.stacks import stack_document

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SECRET = "kubernetes:core/v1:Secret"
MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"


def _containers_reading_the_key(stack: str) -> dict[str, set[str]]:
    """Component -> names of its containers (init containers too) mounting the key's Secret, and the command that
    exports the file as the key's variable."""
    found: dict[str, set[str]] = {}
    for deployment in stack_run(stack).of_type(DEPLOYMENT):
        component = deployment.props["metadata"]["labels"].get(contract.LABEL_COMPONENT, deployment.name)
        pod = deployment.props["spec"]["template"]["spec"]
        volumes = {
            v["name"]
            for v in pod.get("volumes", [])
            if v.get("secret", {}).get("secretName") == contract.ENGINE_API_KEY_SECRET
        }
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            mounted = [m for m in container.get("volumeMounts", []) if m["name"] in volumes]
            if mounted:
                assert [m["mountPath"] for m in mounted] == [ENGINE_API_KEY_FILE.directory]
                assert all(m["readOnly"] for m in mounted)
                assert f'"$$(cat {ENGINE_API_KEY_FILE.path})"' in container["command"][2]
                found.setdefault(component, set()).add(container["name"])
    return found


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_the_engine_key_secret_holds_the_configured_key(stack: str) -> None:
    (secret,) = [
        s for s in stack_run(stack).of_type(SECRET) if s.props["metadata"]["name"] == contract.ENGINE_API_KEY_SECRET
    ]
    assert secret.props["metadata"]["namespace"] == load_spec(stack).spec.cluster.namespace
    assert secret.props["stringData"] == {contract.ENGINE_API_KEY_SECRET_KEY: PLACEHOLDER_ENGINE_API_KEY}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_only_engine_and_gateway_containers_read_the_engine_key(stack: str) -> None:
    readers = _containers_reading_the_key(stack)
    assert readers == {contract.COMPONENT_ENGINE: {"agent"}, contract.COMPONENT_GATEWAY: {"gateway"}}
    engines = [
        d
        for d in stack_run(stack).of_type(DEPLOYMENT)
        if d.props["metadata"]["labels"].get(contract.LABEL_COMPONENT) == contract.COMPONENT_ENGINE
    ]
    assert len(engines) == len(load_spec(stack).spec.engine_pools)  # every pool's Deployment, prefill roles too
    for engine in engines:
        (agent,) = engine.props["spec"]["template"]["spec"]["containers"]
        assert f"export {ENGINE_API_KEY_ENV}" in agent["command"][2]
        assert ENGINE_API_KEY_ENV not in {v["name"] for v in agent["env"]}  # a file, never a Secret in env


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_the_engine_key_never_appears_in_plain_text_in_a_deployment(stack: str) -> None:
    deployments = stack_run(stack).of_type(DEPLOYMENT)
    assert deployments
    for deployment in deployments:
        text = json.dumps(deployment.props)
        assert PLACEHOLDER_ENGINE_API_KEY not in text, deployment.name
        for container in deployment.props["spec"]["template"]["spec"]["containers"]:
            inlined = [v for v in container.get("env", []) if v["name"] == ENGINE_API_KEY_ENV and "value" in v]
            assert inlined == [], deployment.name


def test_the_engine_key_is_a_secret_config_value() -> None:
    config, secrets = offline_config(stack_document("prod"), "prod")
    assert config[ENGINE_API_KEY_CONFIG] == PLACEHOLDER_ENGINE_API_KEY
    assert ENGINE_API_KEY_CONFIG in secrets


def test_a_missing_engine_key_fails_the_program_naming_its_config_key() -> None:
    config, secrets = offline_config(stack_document("prod"), "prod")
    del config[ENGINE_API_KEY_CONFIG]

    def program() -> None:
        runpy.run_path(str(MAIN))

    with pytest.raises(pulumi.ConfigMissingError, match=ENGINE_API_KEY_CONFIG):
        run_offline(program, config, stack="prod", secret_keys=[k for k in secrets if k != ENGINE_API_KEY_CONFIG])
