"""Prometheus: a real Prometheus for the local fleet, scraping every part and evaluating the cluster's alert rules.

``llmfleet up`` starts one when ``prometheus`` is on PATH (``--no-prometheus`` skips it): a child process like
the others, listening on a free loopback port, its TSDB and files in ``<log dir>/prometheus/``. It scrapes every
second and evaluates rules every second:

* the gateway's admin port and the control plane: static targets, known before it starts;
* engines and agents: replicas come and go while the fleet runs, so they are file-based service discovery
  targets (``engines.json``, ``agents.json``) that `refresh_targets` rewrites from the control plane's replica
  listing; Prometheus rereads a changed file by itself. Each target group carries ``llmfleet_io_pool=<pool>``,
  the label the cluster's PodMonitor relabelling gives engine pods and the pool's rules select on.

The rule file is the one the cluster loads (`fleet.slo.rules.rules_yaml`, passed in by ``llmfleet up``),
unchanged: the same expressions, windows and ``for`` durations. `config_yaml` and `replica_targets` are pure;
`LocalPrometheus` does the I/O.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from fleet.slo.rules import PROM_POOL_LABEL
from llmfleet.local.procs import Child

__all__ = [
    "POOL_LABEL",
    "LocalPrometheus",
    "ReplicaTarget",
    "config_yaml",
    "find_prometheus",
    "replica_targets",
]

POOL_LABEL = PROM_POOL_LABEL  # the pod label llmfleet.io/pool as the cluster's PodMonitor relabelling names it
ENGINES_FILE = "engines.json"
AGENTS_FILE = "agents.json"
RULES_FILE = "rules.yml"


def find_prometheus() -> str | None:
    """The ``prometheus`` binary on PATH, or None."""
    return shutil.which("prometheus")


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"not a URL with a host and port: {url!r}")
    return f"{parts.hostname}:{parts.port}"


def config_yaml(gateways: Sequence[str], control_plane: str, *, rules: bool, interval_s: float = 1.0) -> str:
    """prometheus.yml: static jobs for ``gateways`` (their admin URLs) and ``control_plane``, file-discovered
    ``engine`` and ``agent`` jobs, and the rule file when ``rules``; scrape and evaluation every ``interval_s``."""
    every = f"{int(interval_s * 1000)}ms"

    def files(name: str) -> list[dict[str, Any]]:
        return [{"files": [name], "refresh_interval": every}]

    config: dict[str, Any] = {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "scrape_configs": [
            {"job_name": "gateway", "static_configs": [{"targets": [_host_port(g) for g in gateways]}]},
            {"job_name": "control-plane", "static_configs": [{"targets": [_host_port(control_plane)]}]},
            {"job_name": "engine", "file_sd_configs": files(ENGINES_FILE)},
            {"job_name": "agent", "file_sd_configs": files(AGENTS_FILE)},
        ],
    }
    if rules:
        config["rule_files"] = [RULES_FILE]
    return yaml.safe_dump(config, sort_keys=False)


@dataclass(frozen=True)
class ReplicaTarget:
    """One replica's scrape addresses (``host:port``); ``agent`` is None when its reports do not carry it."""

    pool: str
    engine: str
    agent: str | None


def replica_targets(listings: Sequence[Mapping[str, Any]]) -> list[ReplicaTarget]:
    """The replicas of ``GET /v1/pools/{pool}/replicas`` answers (stopped ones left out), sorted."""
    out: list[ReplicaTarget] = []
    for listing in listings:
        for replica in listing["replicas"]:
            if replica["state"] == "stopped":
                continue
            agent = replica.get("last_report", {}).get("agent_url")
            out.append(
                ReplicaTarget(listing["pool"], _host_port(replica["engine_url"]), _host_port(agent) if agent else None)
            )
    return sorted(out, key=lambda t: (t.pool, t.engine))


def target_groups(targets: Sequence[ReplicaTarget], kind: str) -> list[dict[str, Any]]:
    """File-discovery groups of ``kind`` (``engine`` or ``agent``) addresses, one per pool, labelled with it."""
    by_pool: dict[str, list[str]] = {}
    for t in targets:
        address = t.engine if kind == "engine" else t.agent
        if address is not None:
            by_pool.setdefault(t.pool, []).append(address)
    return [{"targets": addresses, "labels": {POOL_LABEL: pool}} for pool, addresses in sorted(by_pool.items())]


def _write_atomic(path: Path, text: str) -> None:
    # Prometheus watches these files: it must never read a half-written one.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


class LocalPrometheus:
    """A Prometheus process for a local fleet: `start` it, `refresh_targets` as replicas change, `stop` it."""

    def __init__(self, binary: str, folder: Path, port: int) -> None:
        self.binary = binary
        self.folder = folder
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.child: Child | None = None
        self._targets: list[ReplicaTarget] | None = None

    def start(self, gateways: Sequence[str], control_plane: str, rules: str | None, log: Path) -> Child:
        """Write the configuration (and ``rules``, a rule file's YAML) and start Prometheus; returns at once."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in (ENGINES_FILE, AGENTS_FILE):
            _write_atomic(self.folder / name, "[]\n")
        if rules is not None:
            _write_atomic(self.folder / RULES_FILE, rules)
        config = self.folder / "prometheus.yml"
        _write_atomic(config, config_yaml(gateways, control_plane, rules=rules is not None))
        argv = [
            f"--config.file={config}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
        ]
        self.child = Child("prometheus", argv, log, program=[self.binary])
        return self.child

    def refresh_targets(self, client: httpx.Client, control_plane: str) -> bool:
        """Rewrite the engine and agent target files from ``control_plane``'s replica listings when the replicas
        changed; returns whether they did. A control plane that does not answer changes nothing."""
        try:
            pools = client.get(f"{control_plane}/v1/pools").raise_for_status().json()["pools"]
            listings = [
                client.get(f"{control_plane}/v1/pools/{p['pool']}/replicas").raise_for_status().json() for p in pools
            ]
            targets = replica_targets(listings)
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        if targets == self._targets:
            return False
        for kind, name in (("engine", ENGINES_FILE), ("agent", AGENTS_FILE)):
            _write_atomic(self.folder / name, json.dumps(target_groups(targets, kind), indent=1) + "\n")
        self._targets = targets
        return True
