"""NVIDIA device plugin: the DaemonSet that advertises ``nvidia.com/gpu`` on GPU nodes.

The AL2023 NVIDIA AMI ships the driver and container toolkit but not the device plugin. The DaemonSet runs
only on nodes labelled ``nvidia.com/gpu.present=true`` (our GPU node groups), tolerates their taint, and is
``system-node-critical`` so it is never evicted before the engines that depend on it. Its image is NVIDIA's
release (`fleet.protocol.contract.DEVICE_PLUGIN_SOURCE`) mirrored into the stack's registry with the same digest. The
pod
follows NVIDIA's static manifest of that release (NVIDIA/k8s-device-plugin v0.19.3,
deployments/static/nvidia-device-plugin.yml): no environment, the kubelet's plugin folder as a ``Directory``;
and no service-account token, since it calls no Kubernetes API (only the kubelet's device-plugin socket).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract

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
                        # The plugin talks to the kubelet's socket only, never the API server: no token.
                        "automount_service_account_token": False,
                        "node_selector": {"nvidia.com/gpu.present": "true"},
                        "tolerations": [{"key": contract.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [
                            {
                                "name": "nvidia-device-plugin",
                                "image": args.image,
                                # No FAIL_ON_INIT_ERROR=false (v0.19.3's manifest dropped it): on a GPU node a plugin
                                # that cannot start should crash-loop where it shows, not idle advertising nothing.
                                "env": [],
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
                            {
                                "name": "device-plugin",
                                "host_path": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
                            }
                        ],
                    },
                },
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({})
