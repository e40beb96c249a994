"""The model store's wiring in the resource graph: engine pods know the bucket and the cache, may read the bucket,
and can write the node cache the agent fetches into; gateway pods know the bucket, may read only its manifests and
tokenizer files, and cache those on a writable volume."""

from __future__ import annotations

import base64
import json
from typing import Any

from fleet.protocol import contract
from infra.nodegroups import node_user_data
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


def test_replicas_on_one_node_share_its_nvme_cache_made_by_the_node_not_the_kubelet() -> None:
    volumes = {v["name"]: v for v in engine_pod(stack_run("prod"))["volumes"]}
    # "Directory": the node's bootstrap made it; the kubelet would make a root-owned one the agent cannot write.
    assert volumes["model-cache"]["hostPath"] == {"path": contract.MODEL_CACHE_HOST_PATH, "type": "Directory"}


def test_no_container_runs_as_root_to_hand_the_cache_to_the_images_user() -> None:
    pod = engine_pod(stack_run("prod"))
    assert "initContainers" not in pod
    (agent,) = pod["containers"]
    assert pod["securityContext"]["runAsUser"] == IMAGE_UID
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT} in agent["volumeMounts"]  # writable: it fetches


def test_gpu_nodes_create_the_cache_owned_by_the_images_user_before_the_kubelet_starts() -> None:
    text = base64.b64decode(node_user_data(model_cache=True)).decode()
    # The unit's ordering against the RAID mount is parsed in tests/infra/test_node_userdata.py.
    assert "text/x-shellscript" in text and "Before=kubelet.service" in text
    for folder in ("", "/store", "/hf"):
        path = f"{contract.MODEL_CACHE_HOST_PATH}{folder}"
        assert f"install -d -o {IMAGE_UID} -g {IMAGE_UID} -m 0750 {path}\n" in text
    assert MODEL_STORE_DIR == f"{MODEL_CACHE_MOUNT}/store"  # the same folders, seen from the container
    assert "text/x-shellscript" not in base64.b64decode(node_user_data()).decode()  # CPU nodes: no cache


def test_every_gpu_launch_template_carries_the_cache_unit() -> None:
    run = stack_run("prod")
    for template in run.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        gpu = contract.TAG_GPU_GROUP in template.props["tags"]
        assert (template.props["userData"] == node_user_data(model_cache=True)) is gpu


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


def gateway_pod(run: OfflineRun) -> dict[str, Any]:
    (deployment,) = [r for r in run.of_type(DEPLOYMENT) if r.props["metadata"]["name"] == contract.GATEWAY_NAME]
    return dict(deployment.props["spec"]["template"]["spec"])


def test_gateway_pods_are_told_the_bucket_and_cache_tokenizers_on_a_volume_of_their_own() -> None:
    run = stack_run("prod")
    pod = gateway_pod(run)
    (gateway,) = pod["containers"]
    env = env_of(gateway)
    assert env["LLMFLEET_MODEL_BUCKET"] == bucket(run).props["bucket"]
    assert env["LLMFLEET_TOKENIZER_CACHE"] == contract.TOKENIZER_CACHE_DIR
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True  # so the cache needs a writable volume
    (mount,) = [m for m in gateway["volumeMounts"] if m["mountPath"] == contract.TOKENIZER_CACHE_DIR]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mount["name"]]


def test_the_gateway_role_reads_only_manifests_and_tokenizer_files_under_the_models_prefix() -> None:
    run = stack_run("prod")
    (account,) = [
        r
        for r in run.of_type("kubernetes:core/v1:ServiceAccount")
        if r.props["metadata"]["name"] == contract.GATEWAY_NAME
    ]
    assert gateway_pod(run)["serviceAccountName"] == contract.GATEWAY_NAME
    role_arn = account.props["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    (role,) = [r for r in run.of_type("aws:iam/role:Role") if r.props["arn"] == role_arn]
    (trust,) = json.loads(role.props["assumeRolePolicy"])["Statement"]
    subjects = {v for k, v in trust["Condition"]["StringEquals"].items() if k.endswith(":sub")}
    assert subjects == {f"system:serviceaccount:llmfleet:{contract.GATEWAY_NAME}"}
    (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == role.name]
    (statement,) = json.loads(policy.props["policy"])["Statement"]
    arn = bucket(run).props["arn"]
    assert (statement["Effect"], statement["Action"]) == ("Allow", "s3:GetObject")
    assert sorted(statement["Resource"]) == [
        f"{arn}/models/*/files/chat_template.jinja",
        f"{arn}/models/*/files/tokenizer.json",
        f"{arn}/models/*/files/tokenizer_config.json",
        f"{arn}/models/*/manifest.json",
    ]


def test_a_stack_without_a_bucket_gives_its_gateways_no_bucket_and_no_role() -> None:
    run = stack_run("dev")
    pod = gateway_pod(run)
    (gateway,) = pod["containers"]
    assert not {"LLMFLEET_MODEL_BUCKET", "LLMFLEET_TOKENIZER_CACHE"} & set(env_of(gateway))
    assert contract.TOKENIZER_CACHE_DIR not in {m["mountPath"] for m in gateway["volumeMounts"]}
    (account,) = [
        r
        for r in run.of_type("kubernetes:core/v1:ServiceAccount")
        if r.props["metadata"]["name"] == contract.GATEWAY_NAME
    ]
    assert not account.props["metadata"].get("annotations")
