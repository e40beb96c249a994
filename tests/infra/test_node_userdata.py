"""GPU node user data, parsed: the cache unit is pulled in by the RAID's mount unit and ordered before kubelet.

The facts checked here come from awslabs/amazon-eks-ami (templates/al2023/runtime/bin/setup-local-disks writes
``$(systemd-escape --path --suffix=mount /mnt/k8s-disks/0)`` and enables it with ``--now`` from nodeadm's run
phase, in ``nodeadm-run.service``, which is ``After=cloud-final.service``): the user data's script runs before
the array exists, so it may only enable the unit, never start it.
"""

from __future__ import annotations

import base64
import email
import re
import shlex
import shutil
import subprocess
from email.message import Message
from pathlib import Path

import pytest

from fleet.protocol import contract
from infra.k8s_base import IMAGE_UID
from infra.node_userdata import (
    MODEL_CACHE_UNIT_NAME,
    RAID_MOUNT_POINT,
    RAID_MOUNT_UNIT,
    node_user_data,
    systemd_escape_path,
)
from infra.pools import MODEL_CACHE_MOUNT
from tests.infra.conftest import stack_run

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """A systemd unit file as section -> key -> values (a key may repeat, as ExecStart= does)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"a key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        section.setdefault(key.strip(), []).extend(value.split() if key.strip() != "ExecStart" else [value])
    return unit


def mime_parts(user_data: str) -> dict[str, str]:
    """content type -> payload of the MIME multipart user data."""
    message = email.message_from_string(base64.b64decode(user_data).decode())
    assert message.is_multipart()
    parts: list[Message] = [p for p in message.walk() if not p.is_multipart()]
    return {p.get_content_type(): str(p.get_payload()) for p in parts}


def script_and_unit(user_data: str) -> tuple[list[str], Unit]:
    """The shell script's commands (outside the heredoc) and the unit the heredoc writes."""
    script = mime_parts(user_data)["text/x-shellscript"]
    heredoc = re.search(r"cat > (\S+) <<'UNIT'\n(.*?)\nUNIT\n", script, re.S)
    assert heredoc is not None, "the script writes the unit with a quoted heredoc"
    assert heredoc.group(1) == f"/etc/systemd/system/{MODEL_CACHE_UNIT_NAME}"
    commands = [c for c in (script[: heredoc.start()] + script[heredoc.end() :]).splitlines() if c.strip()]
    return commands, parse_unit(heredoc.group(2))


@pytest.mark.parametrize(
    ("path", "escaped"),
    [("/mnt/k8s-disks/0", r"mnt-k8s\x2ddisks-0"), ("/var/lib/kubelet", "var-lib-kubelet"), ("/", "-")],
)
def test_systemd_escape_path_matches_systemd(path: str, escaped: str) -> None:
    assert systemd_escape_path(path) == escaped


def test_the_raid_mount_unit_is_the_one_setup_local_disks_writes() -> None:
    assert RAID_MOUNT_UNIT == r"mnt-k8s\x2ddisks-0.mount"
    assert contract.MODEL_CACHE_HOST_PATH.startswith(RAID_MOUNT_POINT + "/")


def test_the_cache_unit_is_pulled_in_by_the_raid_mount_and_ordered_before_kubelet() -> None:
    _, unit = script_and_unit(node_user_data(model_cache=True))
    assert unit["Install"]["WantedBy"] == [RAID_MOUNT_UNIT]
    assert RAID_MOUNT_UNIT in unit["Unit"]["Requires"]
    assert RAID_MOUNT_UNIT in unit["Unit"]["After"]
    assert unit["Unit"]["Before"] == ["kubelet.service"]
    # No ordering against a unit AL2023 does not have (setup-local-disks is a script nodeadm runs, not a unit).
    assert not any("setup-local-disks" in v for values in unit["Unit"].values() for v in values)
    assert unit["Service"]["Type"] == ["oneshot"] and unit["Service"]["RemainAfterExit"] == ["yes"]


def test_user_data_only_enables_the_unit_the_mount_starts_it() -> None:
    commands, _ = script_and_unit(node_user_data(model_cache=True))
    systemctl = [shlex.split(c) for c in commands if c.startswith("systemctl")]
    assert ["systemctl", "enable", MODEL_CACHE_UNIT_NAME] in systemctl
    assert not [c for c in systemctl if c[1] in {"start", "restart", "reload-or-restart"} or "--now" in c]


def test_the_cache_folders_are_made_on_the_raid_for_the_images_user() -> None:
    _, unit = script_and_unit(node_user_data(model_cache=True))
    made = {shlex.split(s)[-1]: shlex.split(s)[:-1] for s in unit["Service"]["ExecStart"]}
    for folder in ("", "/store", "/hf", "/compile/vllm", "/compile/triton", "/compile/inductor"):
        path = contract.MODEL_CACHE_HOST_PATH + folder
        assert made[path] == ["/usr/bin/install", "-d", "-o", str(IMAGE_UID), "-g", str(IMAGE_UID), "-m", "0750"]
    assert all(p.startswith(RAID_MOUNT_POINT + "/") for p in made)


def test_cpu_nodes_get_only_the_node_config() -> None:
    assert set(mime_parts(node_user_data())) == {"application/node.eks.aws"}


def test_engines_keep_their_compile_caches_on_the_node_cache() -> None:
    run = stack_run("prod")
    (deployment,) = [
        r
        for r in run.of_type("kubernetes:apps/v1:Deployment")
        if r.props["metadata"]["labels"].get(contract.LABEL_COMPONENT) == contract.COMPONENT_ENGINE
    ]
    (agent,) = deployment.props["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    for variable, folder in (
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TRITON_CACHE_DIR", "triton"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ):
        assert env[variable] == f"{MODEL_CACHE_MOUNT}/compile/{folder}"


def test_nodes_may_only_pull_images_and_are_reachable_through_session_manager() -> None:
    run = stack_run("prod")
    attached = {
        a.props["policyArn"].rsplit("/", 1)[-1]
        for a in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.name.startswith("nodes-node-")
    }
    assert attached == {
        "AmazonEKSWorkerNodePolicy",
        "AmazonEC2ContainerRegistryPullOnly",
        "AmazonSSMManagedInstanceCore",
    }


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl (systemd 252, as on AL2023)")
def test_enabling_before_the_raid_exists_links_the_unit_into_the_mounts_wants(tmp_path: Path) -> None:
    """What the user data's ``systemctl enable`` does on a node, in an offline root: the mount unit does not exist
    yet (setup-local-disks writes it later), systemctl warns, and still links the unit for the mount to pull in."""
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    _, unit = script_and_unit(node_user_data(model_cache=True))
    script = mime_parts(node_user_data(model_cache=True))["text/x-shellscript"]
    text = re.search(r"<<'UNIT'\n(.*?\n)UNIT\n", script, re.S)
    assert text is not None
    (units / MODEL_CACHE_UNIT_NAME).write_text(text.group(1))
    done = subprocess.run(
        ["systemctl", f"--root={tmp_path}", "enable", MODEL_CACHE_UNIT_NAME], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    link = units / f"{RAID_MOUNT_UNIT}.wants" / MODEL_CACHE_UNIT_NAME
    assert link.is_symlink()
    assert unit["Install"]["WantedBy"] == [RAID_MOUNT_UNIT]
