"""The engine stand-in's JSON flags: `--kv-transfer-config` (which connector, where its LMCache server is) and
`--kv-events-config` (where KV-cache events go), checked before anything starts.

Mirrors vLLM 0.33 with LMCache's `LMCacheMPConnector`: `kv_connector_extra_config` carries `lmcache.mp.host` (default
`tcp://localhost`) and `lmcache.mp.port` (5555), which the connector joins into the server's URL
(lmcache_mp_connector.py:638-650), or `lmcache.mp.server_urls` (a list or a comma-separated string, preferred when set:
:626-637), one server per block of TP ranks (:759-762), and the keys LMCache's adapters resolve themselves
(`ExtraConfigDefault`, vllm_multi_process_adapter.py:100-151), among them `lmcache.mp.mq_timeout` (300 s: each blocking
RPC, start-up included) and `lmcache.mp.heartbeat_interval` (10 s: the ping period and the ping timeout); the stand-in
hands those to the adapters as given (`kv_client`), the two numbers checked here first. vLLM's own
`kv_load_failure_policy` (`fail` or `recompute`, default `fail`: vllm 0.33.0 vllm/config/kv_transfer.py:88-91) says what
becomes of a request whose KV load from LMCache failed (`engine`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from glm53.errors import Glm53Error

CONNECTOR = "LMCacheMPConnector"
DEFAULT_HOST = "tcp://localhost"
DEFAULT_PORT = 5555
DEFAULT_MQ_TIMEOUT = 300.0
DEFAULT_HEARTBEAT_INTERVAL = 10.0
# vllm 0.33.0 vllm/config/kv_transfer.py:88-91: `Literal["recompute", "fail"] = "fail"`.
LOAD_FAILURE_POLICIES = ("recompute", "fail")
DEFAULT_LOAD_FAILURE_POLICY = "fail"


@dataclass(frozen=True)
class ConnectorConfig:
    url: str  # the first server's: the only one unless lmcache.mp.server_urls names several
    mq_timeout: float
    heartbeat_interval: float
    load_failure_policy: str = DEFAULT_LOAD_FAILURE_POLICY
    extra: Mapping[str, Any] = field(default_factory=dict)  # kv_connector_extra_config as given
    # Every server, in rank-block order (lmcache.mp.server_urls); empty: just `url`.
    server_urls: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        return self.server_urls or (self.url,)


def _server_urls(extra: Mapping[str, Any]) -> tuple[str, ...]:
    """lmcache 0.5.6 lmcache_mp_connector.py:626-650: a list or a comma-separated string, blanks dropped, a bare
    host:port given the tcp:// scheme."""
    value = extra.get("lmcache.mp.server_urls")
    if not value:
        return ()
    if not isinstance(value, list | str):
        raise Glm53Error(f"kv_connector_extra_config lmcache.mp.server_urls must be a list or a string, got {value!r}")
    parts = value if isinstance(value, list) else value.split(",")
    urls = [str(u).strip() for u in parts if str(u).strip()]
    return tuple(u if "://" in u else f"tcp://{u}" for u in urls)


def _number(extra: dict[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise Glm53Error(f"kv_connector_extra_config {key} must be a positive number, got {value!r}")
    return float(value)


def _json_object(text: str, flag: str, example: str) -> dict[str, Any]:
    """The JSON object a vLLM config flag carries, or a one-line error naming the flag."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise Glm53Error(f"{flag} is not valid JSON ({error.msg}); pass a JSON object") from None
    if not isinstance(config, dict):
        raise Glm53Error(f"{flag} must be a JSON object, e.g. {example}")
    return config


def parse_connector_config(text: str) -> ConnectorConfig:
    config = _json_object(text, "--kv-transfer-config", '\'{"kv_connector":"LMCacheMPConnector"}\'')
    if config.get("kv_connector") != CONNECTOR:
        raise Glm53Error(
            f"--kv-transfer-config kv_connector must be {CONNECTOR!r} (the mock emulates only LMCache's MP "
            f"connector), got {config.get('kv_connector')!r}"
        )
    extra = config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise Glm53Error("--kv-transfer-config kv_connector_extra_config must be a JSON object")
    host = str(extra.get("lmcache.mp.host", DEFAULT_HOST))
    port = int(_number(extra, "lmcache.mp.port", DEFAULT_PORT))
    servers = _server_urls(extra)
    url = servers[0] if servers else f"{host if '://' in host else 'tcp://' + host}:{port}"
    policy = config.get("kv_load_failure_policy", DEFAULT_LOAD_FAILURE_POLICY)
    if policy not in LOAD_FAILURE_POLICIES:
        raise Glm53Error(f"--kv-transfer-config kv_load_failure_policy must be 'recompute' or 'fail', got {policy!r}")
    return ConnectorConfig(
        url,
        _number(extra, "lmcache.mp.mq_timeout", DEFAULT_MQ_TIMEOUT),
        _number(extra, "lmcache.mp.heartbeat_interval", DEFAULT_HEARTBEAT_INTERVAL),
        policy,
        dict(extra),
        servers,
    )


@dataclass(frozen=True)
class KVEventsConfig:
    """The fields of `--kv-events-config` the stand-in honours (vllm/config/kv_events.py:14-47 for all of them)."""

    endpoint: str = "tcp://*:5557"
    topic: str = ""
    hwm: int = 100_000


def parse_kv_events_config(text: str) -> KVEventsConfig | None:
    """The publisher to start, or None when events are off (`enable_kv_cache_events` false or publisher "null")."""
    config = _json_object(text, "--kv-events-config", "'{\"enable_kv_cache_events\":true}'")
    enabled = bool(config.get("enable_kv_cache_events", False))
    publisher = config.get("publisher") or ("zmq" if enabled else "null")  # kv_events.py:45-47
    if publisher not in ("zmq", "null"):
        raise Glm53Error(f"--kv-events-config publisher must be 'zmq' or 'null', got {publisher!r}")
    if not enabled or publisher == "null":
        return None
    defaults = KVEventsConfig()
    return KVEventsConfig(
        str(config.get("endpoint", defaults.endpoint)),
        str(config.get("topic", defaults.topic)),
        int(config.get("hwm", defaults.hwm)),
    )
