"""Quota Redis: the Secret with the gateways' Redis URL and, on ``kubernetes``, the Redis server itself.

Gateways read the URL from the Secret ``llmfleet-quota-redis`` (key ``url``), mounted as a file that the
container's command exports as ``LLMFLEET_REDIS_URL`` (`infra.k8s_base.llmfleet_command`; no Secret in ``env``),
so the password never sits in the rendered stack file. On ``aws`` the URL is the
ElastiCache group's ``rediss://`` one (`infra.quota_cache`). On ``kubernetes`` this component runs one Redis in
the fleet's namespace: a Deployment of one pod (``Recreate``: never two at once), a ClusterIP Service, its
config in the same Secret (``requirepass`` from the stack's secret), no persistence (quota counters live
seconds to minutes), running as a non-root user on a read-only root filesystem. The in-cluster URL is plain
``redis://``: traffic stays inside the cluster network. A password change takes effect when the Redis and
gateway pods restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from fleet.spec.stack import FleetSpec
from infra.k8s_base import SecretFile
from infra.k8s_shapes import shaped
from infra.quota_cache import REDIS_PORT, check_auth_token

__all__ = [
    "REDIS_IMAGE",
    "QuotaRedis",
    "QuotaRedisArgs",
    "in_cluster_url",
    "provisions_redis",
    "redis_config",
    "redis_pod_spec",
    "redis_url_files",
]

REDIS_IMAGE = "redis:7.2-alpine"
_REDIS_UID = 999  # the image's redis user
_CONFIG_KEY = "redis.conf"


def provisions_redis(spec: FleetSpec) -> bool:
    """Whether the program provisions the quota Redis: Redis quotas on a cloud target and no ``redisUrl``."""
    gateway = spec.gateway
    return spec.target != "local" and gateway.quota_backend == "redis" and gateway.redis_url is None


def redis_url_files(spec: FleetSpec) -> list[SecretFile]:
    """The gateway's ``$LLMFLEET_REDIS_URL`` as a file of the provisioned Redis' Secret, if the program made one."""
    if not provisions_redis(spec):
        return []
    return [
        SecretFile(
            variable=contract.REDIS_URL_ENV,
            secret=contract.QUOTA_REDIS_NAME,
            key=contract.REDIS_URL_KEY,
            directory="/etc/llmfleet/quota-redis",
            volume="quota-redis",
        )
    ]


def redis_config(password: str) -> str:
    """Redis config: password auth, no persistence, bounded memory evicting the keys closest to expiry."""
    return "\n".join(
        [
            f"port {REDIS_PORT}",
            # Double-quoted so any character the token check allows survives redis.conf's parser.
            'requirepass "{}"'.format(password.replace("\\", "\\\\")),
            'save ""',
            "appendonly no",
            "dir /data",
            "maxmemory 200mb",
            # Every quota key has a TTL; under memory pressure drop those about to expire anyway.
            "maxmemory-policy volatile-ttl",
            "",
        ]
    )


def in_cluster_url(namespace: str, password: str) -> str:
    host = f"{contract.QUOTA_REDIS_NAME}.{namespace}.svc.cluster.local"
    return f"redis://:{quote(password, safe='')}@{host}:{REDIS_PORT}/0"


@dataclass(frozen=True)
class QuotaRedisArgs:
    spec: FleetSpec
    password: pulumi.Input[str]  # secret: the in-cluster Redis' password (kubernetes)
    url: pulumi.Input[str] | None = None  # secret: the provisioned Redis' URL (aws); None runs Redis in the cluster
    after: Sequence[pulumi.Resource] = field(default_factory=list)  # what every object waits for (the namespace)


class QuotaRedis(pulumi.ComponentResource):
    """The URL Secret, plus Deployment and Service when Redis runs in the cluster; ``ready`` is what the
    gateway Deployment waits for."""

    secret: k8s.core.v1.Secret
    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: QuotaRedisArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:QuotaRedis", name, None, opts)
        spec = args.spec
        namespace = spec.cluster.namespace
        labels = {
            "app.kubernetes.io/name": "redis",
            contract.LABEL_COMPONENT: contract.COMPONENT_QUOTA_REDIS,
            contract.LABEL_ENVIRONMENT: spec.environment,
        }
        meta: k8s.meta.v1.ObjectMetaArgsDict = {
            "name": contract.QUOTA_REDIS_NAME,
            "namespace": namespace,
            "labels": labels,
        }
        after = list(args.after)
        secret_key = spec.gateway.redis.auth_token_secret
        data: dict[str, pulumi.Input[str]]
        if args.url is not None:
            data = {contract.REDIS_URL_KEY: args.url}
        else:
            password = pulumi.Output.secret(args.password).apply(lambda p: check_auth_token(p, secret_key))
            data = {
                contract.REDIS_URL_KEY: password.apply(lambda p: in_cluster_url(namespace, p)),
                _CONFIG_KEY: password.apply(redis_config),
            }
        self.secret = k8s.core.v1.Secret(
            f"{name}-secret",
            metadata=meta,
            type="Opaque",
            string_data=data,
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )
        self.ready = [self.secret]
        if args.url is None:
            self.ready += self._server(name, meta, labels, after)
        self.register_outputs({"secret": contract.QUOTA_REDIS_NAME})

    def _server(
        self, name: str, meta: k8s.meta.v1.ObjectMetaArgsDict, labels: dict[str, str], after: list[pulumi.Resource]
    ) -> list[pulumi.Resource]:
        deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta,
            spec=shaped(
                {
                    "replicas": 1,
                    "strategy": {"type": "Recreate"},
                    "selector": {"match_labels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": redis_pod_spec()},
                },
                k8s.apps.v1.DeploymentSpecArgsDict,
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, self.secret]),
        )
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=meta,
            spec=shaped(
                {
                    "type": "ClusterIP",
                    "selector": labels,
                    "ports": [{"name": "redis", "port": REDIS_PORT, "target_port": "redis"}],
                },
                k8s.core.v1.ServiceSpecArgsDict,
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )
        return [deployment, service]


def redis_pod_spec() -> dict[str, Any]:
    """The in-cluster Redis' pod spec: non-root, read-only root, its config from the Secret, data in an emptyDir."""
    return {
        "security_context": {
            "run_as_non_root": True,
            "run_as_user": _REDIS_UID,
            "run_as_group": _REDIS_UID,
            "fs_group": _REDIS_UID,
            "seccomp_profile": {"type": "RuntimeDefault"},
        },
        "automount_service_account_token": False,
        "containers": [
            {
                "name": "redis",
                "image": REDIS_IMAGE,
                "command": ["redis-server", f"/etc/redis/{_CONFIG_KEY}"],
                "ports": [{"name": "redis", "container_port": REDIS_PORT}],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
                "readiness_probe": {"tcp_socket": {"port": REDIS_PORT}, "period_seconds": 5},
                "liveness_probe": {"tcp_socket": {"port": REDIS_PORT}, "period_seconds": 10},
                "security_context": {
                    "allow_privilege_escalation": False,
                    "read_only_root_filesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volume_mounts": [
                    {"name": "config", "mount_path": "/etc/redis", "read_only": True},
                    {"name": "data", "mount_path": "/data"},
                ],
            }
        ],
        "volumes": [
            {
                "name": "config",
                "secret": {
                    "secret_name": contract.QUOTA_REDIS_NAME,
                    "items": [{"key": _CONFIG_KEY, "path": _CONFIG_KEY}],
                },
            },
            {"name": "data", "empty_dir": {"size_limit": "256Mi"}},
        ],
    }
