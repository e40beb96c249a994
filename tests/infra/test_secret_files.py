"""Hardened objects: secrets reach processes as files, engines and gateways write only to volumes, and only the pods
that call the Kubernetes API mount an API token."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleet.protocol import contract
from fleet.spec.loader import list_stacks, load_spec
from infra.k8s_base import HOME_DIR, SecretFile, llmfleet_command
from infra.pools import COMPILE_CACHE_ENV
from policies.pod_security import secret_env_problems, workload_pod
from tests.infra.conftest import stack_run

CLOUD_STACKS = [s for s in list_stacks() if load_spec(s).spec.target != "local"]
DEPLOYMENT = "kubernetes:apps/v1:Deployment"


def _kubelet(command: list[str], args: list[str]) -> list[str]:
    """What the kubelet runs: ``command`` then ``args``, ``$$`` unescaped to ``$`` (no ``$(NAME)`` of ours resolves)."""
    return [part.replace("$$", "$") for part in [*command, *args]]


def _fake_llmfleet(folder: Path) -> dict[str, str]:
    """An environment whose ``llmfleet`` prints the key's variable and its arguments."""
    program = folder / "bin" / "llmfleet"
    program.parent.mkdir()
    program.write_text('#!/bin/sh\necho "key=$LLMFLEET_ENGINE_API_KEY url=$LLMFLEET_REDIS_URL args=$*"\n')
    program.chmod(0o755)
    return {"PATH": f"{program.parent}:{os.environ['PATH']}"}


def _files(folder: Path) -> list[SecretFile]:
    return [
        SecretFile("LLMFLEET_ENGINE_API_KEY", "k", "api-key", str(folder / "key"), "key"),
        SecretFile("LLMFLEET_REDIS_URL", "r", "url", str(folder / "redis dir"), "redis"),  # a space, quoted
    ]


def test_the_command_exports_each_file_and_execs_llmfleet_with_the_pods_args(tmp_path: Path) -> None:
    files = _files(tmp_path)
    for item, text in zip(files, ["sk-engine\n", "redis://:p$w@host:6379/0"], strict=True):
        Path(item.directory).mkdir()
        Path(item.path).write_text(text)
    argv = _kubelet(llmfleet_command(files), ["gateway", "--port", "8080"])
    done = subprocess.run(argv, env=_fake_llmfleet(tmp_path), capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "key=sk-engine url=redis://:p$w@host:6379/0 args=gateway --port 8080\n"


def test_a_missing_file_stops_the_container_before_llmfleet_starts(tmp_path: Path) -> None:
    argv = _kubelet(llmfleet_command(_files(tmp_path)), ["gateway"])
    done = subprocess.run(argv, env=_fake_llmfleet(tmp_path), capture_output=True, text=True, timeout=10)
    assert done.returncode != 0 and done.stdout == ""


def test_without_files_the_command_is_llmfleet_itself() -> None:
    assert llmfleet_command() == ["llmfleet"]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_no_workload_takes_a_secret_through_its_environment(stack: str) -> None:
    for resource in stack_run(stack).resources:
        pod = workload_pod(resource.type, resource.props)
        if pod is not None:
            assert secret_env_problems(pod) == [], resource.name


def _pod(stack: str, component: str) -> dict[str, Any]:
    (deployment, *_) = [
        d
        for d in stack_run(stack).of_type(DEPLOYMENT)
        if d.props["metadata"]["labels"].get(contract.LABEL_COMPONENT) == component
    ]
    return dict(deployment.props["spec"]["template"]["spec"])


def _writable(pod: dict[str, Any]) -> set[str]:
    """Mount paths of the volumes the container may write: emptyDirs and hostPaths not mounted read-only."""
    kinds = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    return {
        m["mountPath"]
        for m in container["volumeMounts"]
        if not m.get("readOnly") and ("emptyDir" in kinds[m["name"]] or "hostPath" in kinds[m["name"]])
    }


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_engines_write_only_to_their_cache_tmp_shm_and_home(stack: str) -> None:
    pod = _pod(stack, contract.COMPONENT_ENGINE)
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert _writable(pod) == {"/models", "/tmp", "/dev/shm", HOME_DIR}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOME"] == HOME_DIR  # ~/.cache and ~/.config, whatever the image's user has
    for variable in [*COMPILE_CACHE_ENV, "HF_HOME", "LLMFLEET_MODEL_CACHE"]:
        assert env[variable].startswith("/models/"), variable


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_gateways_write_only_to_tmp_and_their_tokenizer_cache(stack: str) -> None:
    pod = _pod(stack, contract.COMPONENT_GATEWAY)
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert _writable(pod) <= {"/tmp", contract.TOKENIZER_CACHE_DIR}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_only_the_engine_and_control_plane_pods_mount_an_api_token(stack: str) -> None:
    """The agent reviews drain callers' tokens and the control plane scales, leases and reviews: API calls. The
    gateway's control token (audience ``llmfleet``) is no API credential."""
    mounting = set()
    for resource in stack_run(stack).resources:
        pod = workload_pod(resource.type, resource.props)
        if pod is not None and pod.get("automountServiceAccountToken") is not False:
            mounting.add(resource.props["metadata"]["labels"].get(contract.LABEL_COMPONENT))
    assert mounting == {contract.COMPONENT_ENGINE, contract.COMPONENT_CONTROL_PLANE}
