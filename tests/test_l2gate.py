"""The supervisor's gate before a shared L2 tier (`glm53.l2gate`): the handshake LMCache's client makes, read by a real
Redis (Debian's redis-server 7.0.15, scripts/setup.d/34-redis.sh)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from glm53.errors import Glm53Error
from glm53.l2gate import RespEndpoint, encode, handshake, verdict, wait_for_tier
from glm53.pod.loopback import free_ports
from glm53.testing.redis_server import TOOLS_BIN, RedisServer


def test_the_handshake_authenticates_as_lmcache_would_then_pings() -> None:
    assert handshake({}) == [("PING",)]
    assert handshake({"LMCACHE_RESP_PASSWORD": "pw"}) == [("AUTH", "pw"), ("PING",)]
    assert handshake({"LMCACHE_RESP_PASSWORD": "pw", "LMCACHE_RESP_USERNAME": "u"}) == [("AUTH", "u", "pw"), ("PING",)]
    assert encode("AUTH", "p*w") == b"*2\r\n$4\r\nAUTH\r\n$3\r\np*w\r\n"


def test_the_verdict_is_pong_or_redis_own_error_line() -> None:
    assert verdict(b"+OK\r\n+PONG\r\n") is None
    wrong = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n-NOAUTH Authentication required.\r\n"
    assert verdict(wrong) == "WRONGPASS invalid username-password pair or user is disabled."
    assert verdict(b"-NOAUTH Authentication required.\r\n") == "NOAUTH Authentication required."
    assert verdict(b"") == "unexpected reply b''"


@pytest.fixture
def redis(tmp_path: Path) -> RedisServer:
    program = shutil.which("redis-server") or shutil.which("redis-server", path=str(TOOLS_BIN))
    assert program, "redis-server not found; run `bash scripts/setup.d/34-redis.sh`"
    # A password with the characters RESP itself uses: the gate counts replies by command, not by what it sent.
    return RedisServer(free_ports(1)[0], "s3*cr$t\r", tmp_path, program)


def test_the_gate_passes_on_the_servers_credentials_and_refuses_wrong_ones_in_one_line(redis: RedisServer) -> None:
    redis.start()
    said: list[str] = []
    try:
        endpoint = RespEndpoint("127.0.0.1", redis.port)
        wait_for_tier(endpoint, {"LMCACHE_RESP_PASSWORD": redis.password}, said.append)
        with pytest.raises(Glm53Error) as refused:
            wait_for_tier(endpoint, {"LMCACHE_RESP_PASSWORD": "wrong"}, said.append)
    finally:
        redis.kill()
    assert said == [f"glm53 supervise: the L2 tier at 127.0.0.1:{redis.port} answers; starting the server"]
    assert refused.value.message.startswith(
        f"the L2 tier at 127.0.0.1:{redis.port} refuses the server's credentials (WRONGPASS"
    )
