"""NVIDIA device plugin: the DaemonSet that advertises ``nvidia.com/gpu`` on GPU nodes.

The AL2023 NVIDIA AMI ships the driver and container toolkit but not the device plugin. The DaemonSet runs
only on nodes labelled ``nvidia.com/gpu.present=true`` (our GPU node groups), tolerates their taint, and is
``system-node-critical`` so it is never evicted before the engines that depend on it. Its image is NVIDIA's
release (`fleet.contract.DEVICE_PLUGIN_SOURCE`) mirrored into the stack's registry with the same digest.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from fleet import contract

__all__ = ["DevicePlugin", "DevicePluginArgs"]


@dataclass(frozen=True)
class DevicePluginArgs:
    image: pulumi.Input[str]  # pinned by digest (`infra.images.ImageRefs.device_plugin`)


class DevicePlugin(pulumi.ComponentResource):
    """The DaemonSet in ``kube-system``."""

    def __init__(self, name: str, args: DevicePluginArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:DevicePlugin", name, None, opts)
        labels = {
            "app.kubernetes.io/name": "nvidia-device-plugin",
            contract.LABEL_COMPONENT: contract.COMPONENT_DEVICE_PLUGIN,
        }
        k8s.apps.v1.DaemonSet(
            f"{name}-daemonset",
            metadata={"name": "nvidia-device-plugin", "namespace": "kube-system", "labels": labels},
            spec={
                "selector": {"match_labels": labels},
                "update_strategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "priority_class_name": "system-node-critical",
                        "node_selector": {"nvidia.com/gpu.present": "true"},
                        "tolerations": [{"key": contract.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [
                            {
                                "name": "nvidia-device-plugin",
                                "image": args.image,
                                "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}],
                                "security_context": {
                                    "allow_privilege_escalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volume_mounts": [
                                    {"name": "device-plugin", "mount_path": "/var/lib/kubelet/device-plugins"}
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "device-plugin", "host_path": {"path": "/var/lib/kubelet/device-plugins"}}
                        ],
                    },
                },
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({})
