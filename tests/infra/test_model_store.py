"""The model store's wiring in the resource graph: engine pods know the bucket and the cache, may read the bucket,
and can write the node cache the agent fetches into."""

from __future__ import annotations

import json
from typing import Any

from fleet import contract
from infra.offline import OfflineRun, RecordedResource
from infra.pools import MODEL_CACHE_MOUNT, MODEL_STORE_DIR
from tests.infra.conftest import stack_run

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
IMAGE_UID = 10001  # USER in images/*.Dockerfile


def engine_pod(run: OfflineRun) -> dict[str, Any]:
    (deployment,) = [
        r
        for r in run.of_type(DEPLOYMENT)
        if r.props["metadata"]["labels"].get(contract.LABEL_COMPONENT) == contract.COMPONENT_ENGINE
    ]
    return dict(deployment.props["spec"]["template"]["spec"])


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container["env"]}


def bucket(run: OfflineRun) -> RecordedResource:
    (resource,) = run.of_type("aws:s3/bucket:Bucket")
    return resource


def test_engine_pods_are_told_the_stacks_bucket_and_the_cache_folder() -> None:
    run = stack_run("prod")
    (agent,) = engine_pod(run)["containers"]
    env = env_of(agent)
    assert env["LLMFLEET_MODEL_BUCKET"] == bucket(run).props["bucket"] == run.outputs["modelBucket"]
    assert env["LLMFLEET_MODEL_CACHE"] == MODEL_STORE_DIR
    assert env["HF_HOME"] == f"{MODEL_CACHE_MOUNT}/hf"  # the Hub fallback's downloads land on the same disk
    assert MODEL_STORE_DIR.startswith(f"{MODEL_CACHE_MOUNT}/")
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT} in agent["volumeMounts"]


def test_replicas_on_one_node_share_its_nvme_cache() -> None:
    volumes = {v["name"]: v for v in engine_pod(stack_run("prod"))["volumes"]}
    assert volumes["model-cache"]["hostPath"] == {"path": contract.MODEL_CACHE_HOST_PATH, "type": "DirectoryOrCreate"}


def test_an_init_container_hands_the_root_owned_host_path_to_the_images_user() -> None:
    pod = engine_pod(stack_run("prod"))
    (init,) = pod["initContainers"]
    (agent,) = pod["containers"]
    assert init["image"] == agent["image"]  # the pinned engine image: nothing else to pull or trust
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT} in init["volumeMounts"]
    assert init["securityContext"]["runAsUser"] == 0 and not init["securityContext"]["allowPrivilegeEscalation"]
    script = init["command"][-1]
    assert f"chown {IMAGE_UID}:{IMAGE_UID} {MODEL_STORE_DIR} {MODEL_CACHE_MOUNT}/hf" in script
    assert "-R" not in script  # a full cache would make every pod start walk terabytes
    assert "runAsUser" not in agent.get("securityContext", {})  # the agent itself stays the image's user


def test_the_engine_service_account_reads_exactly_the_bucket_the_pods_are_told() -> None:
    run = stack_run("prod")
    (account,) = [
        r
        for r in run.of_type("kubernetes:core/v1:ServiceAccount")
        if r.props["metadata"]["name"] == contract.ENGINE_SERVICE_ACCOUNT
    ]
    assert engine_pod(run)["serviceAccountName"] == contract.ENGINE_SERVICE_ACCOUNT
    role_arn = account.props["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    (role,) = [r for r in run.of_type("aws:iam/role:Role") if r.props["arn"] == role_arn]
    (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.startswith(role.name)]
    statements = json.loads(policy.props["policy"])["Statement"]
    reads = [s for s in statements if s["Action"] == "s3:GetObject"]  # manifest and files, Range requests too
    assert [s["Resource"] for s in reads] == [f"{bucket(run).props['arn']}/*"]


def test_a_stack_without_a_bucket_fetches_nothing_and_needs_no_init_container() -> None:
    pod = engine_pod(stack_run("dev"))  # target kubernetes: no AWS resources, no model bucket
    (agent,) = pod["containers"]
    assert "LLMFLEET_MODEL_BUCKET" not in env_of(agent)
    assert "initContainers" not in pod
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["model-cache"]  # writable by any user
