"""`yrelay serve` as the README runs it: embedded Redis, durable settings."""

import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from yrelay.storage.embedded import durability_warnings, free_port
from yrelay_tools.testing.processes import wait_ready


def test_serve_starts_and_stops_an_embedded_durable_redis(tmp_path):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "yrelay", "serve", "--port", str(port), "--data-dir", "data"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,  # relative, as the README runs it
    )
    try:
        wait_ready(port, process)
        assert (tmp_path / "data" / "redis" / "appendonly.aof").exists()
        redis_pids = subprocess.run(
            ["pgrep", "-P", str(process.pid), "redis-server"], capture_output=True, text=True
        ).stdout.split()
        assert len(redis_pids) == 1, "no embedded redis-server child"
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=20)
    assert "embedded redis-server" in output
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{redis_pids[0]}"), "embedded redis-server outlived the server"


def test_embedded_redis_has_durable_settings(redis_process):
    client = redis.Redis.from_url(redis_process.url, decode_responses=True)
    config = {
        **client.config_get("appendonly"),
        **client.config_get("appendfsync"),
        **client.config_get("maxmemory-policy"),
    }
    assert durability_warnings(config) == []


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({"appendonly": "no", "maxmemory-policy": "noeviction"}, "appendonly is off"),
        ({"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}, "one second"),
        ({"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "allkeys-lru"}, "evict"),
    ],
)
def test_durability_warnings_say_what_is_at_risk(config, fragment):
    [warning] = durability_warnings(config)
    assert fragment in warning
