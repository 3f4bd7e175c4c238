"""The client address behind a load balancer: ``X-Forwarded-For`` counts only
from a peer in ``trusted_proxies``; it is the address the per-address limit uses."""

from __future__ import annotations

import json

import pytest
import websockets

from conftest import running_server
from yrelay.config import Settings


async def _first_frame(url: str, forwarded_for: str) -> tuple[dict, websockets.ClientConnection]:
    """Open a websocket claiming to come from ``forwarded_for``; its answer to ``hello``."""
    ws = await websockets.connect(url, additional_headers={"X-Forwarded-For": forwarded_for})
    try:
        await ws.send(json.dumps({"op": "hello"}))
    except websockets.ConnectionClosed:
        pass  # refused: the error frame was sent and the socket closed already
    return json.loads(await ws.recv()), ws


async def test_a_spoofed_header_from_an_untrusted_peer_is_ignored(redis_url):
    # No trusted proxy (the default): both sockets come from 127.0.0.1, whatever they claim.
    # (uvicorn alone trusts loopback peers: this failed before trusted_proxies.)
    async with running_server(redis_url, max_connections_per_address=1) as url:
        first, ws1 = await _first_frame(url, "203.0.113.1")
        second, ws2 = await _first_frame(url, "203.0.113.2")
        assert first["op"] == "welcome"
        assert second["op"] == "error" and second["code"] == "too_many_connections", second
        await ws1.close()
        await ws2.close()


async def test_a_trusted_proxys_header_names_the_client_for_the_limit(redis_url):
    async with running_server(redis_url, max_connections_per_address=1, trusted_proxies=("127.0.0.0/8",)) as url:
        first, ws1 = await _first_frame(url, "203.0.113.1")
        second, ws2 = await _first_frame(url, "203.0.113.2")  # another client behind the same proxy
        third, ws3 = await _first_frame(url, "198.51.100.7, 203.0.113.1")  # 203.0.113.1 again (the proxy appended it)
        assert first["op"] == second["op"] == "welcome"
        assert third["op"] == "error" and third["code"] == "too_many_connections", third
        for ws in (ws1, ws2, ws3):
            await ws.close()


def test_trusted_proxies_must_be_addresses_or_networks():
    assert Settings(trusted_proxies=("10.0.0.0/8", "::1")).proxy_options() == {
        "proxy_headers": True,
        "forwarded_allow_ips": "10.0.0.0/8,::1",
    }
    assert Settings().proxy_options() == {"proxy_headers": False}
    with pytest.raises(ValueError, match="trusted_proxies"):
        Settings(trusted_proxies=("proxy.example.com",))
