"""The local Prometheus's files: its configuration and rule file (checked by promtool where present) and the
replica targets written from the control plane's replica listings."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.slo.rules import rules_yaml
from llmfleet.local.prometheus import POOL_LABEL, ReplicaTarget, config_yaml, replica_targets, target_groups
from tests.support.stacks import spec


def _replica(engine: str, state: str = "ready", agent: str | None = "http://127.0.0.1:9001") -> dict[str, Any]:
    report = {"agent_url": agent} if agent else {}
    return {"replica": engine, "engine_url": engine, "state": state, "stale": False, "last_report": report}


LISTINGS = [
    {
        "pool": "qwen-7b",
        "replicas": [
            _replica("http://127.0.0.1:7002", agent="http://127.0.0.1:9002"),
            _replica("http://127.0.0.1:7001"),
            _replica("http://127.0.0.1:7003", state="stopped"),
        ],
    },
    {"pool": "small", "replicas": [_replica("http://127.0.0.1:7101", agent=None)]},
]


def test_replicas_become_targets_labelled_with_their_pool_and_stopped_ones_are_left_out() -> None:
    targets = replica_targets(LISTINGS)
    assert targets == [
        ReplicaTarget("qwen-7b", "127.0.0.1:7001", "127.0.0.1:9001"),
        ReplicaTarget("qwen-7b", "127.0.0.1:7002", "127.0.0.1:9002"),
        ReplicaTarget("small", "127.0.0.1:7101", None),
    ]
    assert target_groups(targets, "engine") == [
        {"targets": ["127.0.0.1:7001", "127.0.0.1:7002"], "labels": {POOL_LABEL: "qwen-7b"}},
        {"targets": ["127.0.0.1:7101"], "labels": {POOL_LABEL: "small"}},
    ]
    assert target_groups(targets, "agent") == [
        {"targets": ["127.0.0.1:9001", "127.0.0.1:9002"], "labels": {POOL_LABEL: "qwen-7b"}}
    ]


def test_the_configuration_scrapes_and_evaluates_every_second() -> None:
    config = yaml.safe_load(config_yaml(["http://127.0.0.1:8081"], "http://127.0.0.1:8090", rules=True))
    assert config["global"] == {
        "scrape_interval": "1000ms",
        "scrape_timeout": "1000ms",
        "evaluation_interval": "1000ms",
    }
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["gateway"]["static_configs"] == [{"targets": ["127.0.0.1:8081"]}]
    assert jobs["control-plane"]["static_configs"] == [{"targets": ["127.0.0.1:8090"]}]
    assert jobs["engine"]["file_sd_configs"][0]["files"] == ["engines.json"]
    assert config["rule_files"] == ["rules.yml"]
    assert "rule_files" not in yaml.safe_load(config_yaml(["http://127.0.0.1:1"], "http://127.0.0.1:2", rules=False))


def test_a_url_without_a_port_is_refused() -> None:
    with pytest.raises(ValueError, match="host and port"):
        config_yaml(["http://gateway"], "http://127.0.0.1:8090", rules=False)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool on PATH")
def test_promtool_accepts_the_configuration_and_the_stacks_rules(tmp_path: Path) -> None:
    config = config_yaml(["http://127.0.0.1:8081"], "http://127.0.0.1:8090", rules=True)
    (tmp_path / "prometheus.yml").write_text(config)
    (tmp_path / "rules.yml").write_text(rules_yaml(spec("local-sim")))
    for name, groups in (("engines.json", target_groups(replica_targets(LISTINGS), "engine")), ("agents.json", [])):
        (tmp_path / name).write_text(json.dumps(groups))
    done = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
