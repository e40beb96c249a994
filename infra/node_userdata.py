"""Node user data: the nodeadm NodeConfig every node gets, and on GPU nodes the unit that makes the model cache.

The cache lives on the instance-store RAID that nodeadm assembles, so the unit that creates it must run after
that array is mounted and before the kubelet starts pods. On AL2023 the array is set up by nodeadm's *run*
phase (``nodeadm-run.service``, ordered after ``cloud-final.service``, so after this user data's script): its
``setup-local-disks`` writes ``mnt-k8s\\x2ddisks-0.mount`` and runs ``systemctl enable --now`` on it, then
nodeadm starts containerd and the kubelet. Nothing is mounted yet while the script below runs, so the script
only installs and *enables* the unit: its ``WantedBy=`` is the RAID's mount unit, so starting that mount pulls
the unit in (``Requires=``/``After=`` the mount: it never runs on the root disk), and ``Before=kubelet.service``
holds the kubelet until the folders exist. See docs/cloud.md, "GPU node bootstrap".
"""

from __future__ import annotations

import base64

from fleet.protocol import contract
from infra.k8s_base import IMAGE_UID

__all__ = [
    "MODEL_CACHE_FOLDERS",
    "MODEL_CACHE_UNIT_NAME",
    "RAID_MOUNT_POINT",
    "RAID_MOUNT_UNIT",
    "model_cache_script",
    "model_cache_unit",
    "node_user_data",
    "systemd_escape_path",
]

# Where nodeadm's setup-local-disks mounts a RAID0/RAID10 array (``${MNT_DIR}/0``, MNT_DIR=/mnt/k8s-disks).
RAID_MOUNT_POINT = "/mnt/k8s-disks/0"
MODEL_CACHE_UNIT_NAME = "llmfleet-model-cache.service"
# Folders under the cache, seen in the engine container under /models (`infra.pools`): fetched weights, the
# Hugging Face cache, and the vLLM, Triton and Inductor compile caches (so a restart skips recompiling).
MODEL_CACHE_FOLDERS = ("", "/store", "/hf", "/compile", "/compile/vllm", "/compile/triton", "/compile/inductor")

_NODE_CONFIG = """apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0
"""


def systemd_escape_path(path: str) -> str:
    """``systemd-escape --path``: strip the slashes at both ends, each other ``/`` becomes ``-``, and every byte
    outside ``[A-Za-z0-9:_.]`` (``-`` included) becomes ``\\xNN``; a leading ``.`` is escaped too."""
    trimmed = path.strip("/")
    if not trimmed:
        return "-"
    out: list[str] = []
    for index, char in enumerate(trimmed):
        if char == "/":
            out.append("-")
        elif (char.isascii() and char.isalnum()) or char in ":_" or (char == "." and index > 0):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "".join(out)


RAID_MOUNT_UNIT = f"{systemd_escape_path(RAID_MOUNT_POINT)}.mount"  # mnt-k8s\x2ddisks-0.mount


def model_cache_unit() -> str:
    """The oneshot unit creating the model cache folders on the RAID, owned by the images' user (a hostPath
    ignores fsGroup, so no pod needs root to make it writable)."""
    if not contract.MODEL_CACHE_HOST_PATH.startswith(RAID_MOUNT_POINT + "/"):
        raise ValueError(f"the model cache {contract.MODEL_CACHE_HOST_PATH} is not on the RAID {RAID_MOUNT_POINT}")
    install = f"/usr/bin/install -d -o {IMAGE_UID} -g {IMAGE_UID} -m 0750"
    starts = "".join(f"ExecStart={install} {contract.MODEL_CACHE_HOST_PATH}{f}\n" for f in MODEL_CACHE_FOLDERS)
    return (
        "[Unit]\n"
        "Description=llmfleet model cache on the instance-store RAID, owned by the images' user\n"
        f"Requires={RAID_MOUNT_UNIT}\n"
        f"After={RAID_MOUNT_UNIT}\n"
        "Before=kubelet.service\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"{starts}"
        "\n"
        "[Install]\n"
        f"WantedBy={RAID_MOUNT_UNIT}\n"
    )


def model_cache_script() -> str:
    """The user-data script: write the unit and enable it. It must not start it: the RAID is not mounted yet
    (systemctl warns that the mount unit does not exist yet and still links the unit into its ``.wants``)."""
    return (
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        f"cat > /etc/systemd/system/{MODEL_CACHE_UNIT_NAME} <<'UNIT'\n"
        f"{model_cache_unit()}"
        "UNIT\n"
        "systemctl daemon-reload\n"
        f"systemctl enable {MODEL_CACHE_UNIT_NAME}\n"
    )


def node_user_data(model_cache: bool = False) -> str:
    """Base64 MIME user data: a nodeadm NodeConfig that RAIDs the instance-store NVMe drives (merged by EKS), and
    with ``model_cache`` (GPU nodes) the script installing the unit that creates the engines' model cache."""
    boundary = "LLMFLEET"
    parts = [f"Content-Type: application/node.eks.aws\n\n{_NODE_CONFIG}"]
    if model_cache:
        parts.append(f'Content-Type: text/x-shellscript; charset="us-ascii"\n\n{model_cache_script()}')
    body = f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{boundary}"\n\n'
    body += "".join(f"--{boundary}\n{part}\n" for part in parts) + f"--{boundary}--\n"
    return base64.b64encode(body.encode()).decode()
