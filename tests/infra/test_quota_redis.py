"""The in-cluster quota Redis: any password the token check allows survives the URL and the config file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import redis
from redis.connection import parse_url

from fleet.protocol.ports import free_port
from infra.quota_cache import check_auth_token
from infra.quota_redis import in_cluster_url, redis_config
from tests.support.wait import wait_for

AWKWARD = "p#ss%w:rd'with\\back?slash&more"  # every character here passes check_auth_token


def test_the_url_carries_an_awkward_password_intact() -> None:
    assert parse_url(in_cluster_url("llmfleet", check_auth_token(AWKWARD, "k")))["password"] == AWKWARD


@pytest.mark.redis
def test_a_real_redis_takes_the_rendered_config_and_only_that_password(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH (apt-get install redis-server)")
    port = free_port()
    config = redis_config(AWKWARD).replace("port 6379", f"port {port}").replace("dir /data", f"dir {tmp_path}")
    (tmp_path / "redis.conf").write_text(config + "bind 127.0.0.1\n")
    server = subprocess.Popen([binary, str(tmp_path / "redis.conf")], stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port, password=AWKWARD, socket_connect_timeout=1)

        def answers() -> bool:
            assert server.poll() is None, "redis-server refused the rendered config"
            return bool(client.ping())

        wait_for(answers, timeout_s=10, what="redis-server with the rendered config", ignore=(redis.ConnectionError,))
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, password="not-the-password").ping()
    finally:
        server.terminate()
        server.wait(timeout=10)
