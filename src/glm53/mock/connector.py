"""The engine stand-in's JSON flags: `--kv-transfer-config` (which connector, where its LMCache server is) and
`--kv-events-config` (where KV-cache events go), checked before anything starts.

Mirrors vLLM 0.33 with LMCache's `LMCacheMPConnector`: `kv_connector_extra_config` carries `lmcache.mp.host`
(default `tcp://localhost`), `lmcache.mp.port` (5555), `lmcache.mp.mq_timeout` (300 s, how long start-up waits for
the server) and `lmcache.mp.heartbeat_interval` (10 s, how long an unreachable server is skipped while serving).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from glm53.errors import Glm53Error

CONNECTOR = "LMCacheMPConnector"
DEFAULT_HOST = "tcp://localhost"
DEFAULT_PORT = 5555
DEFAULT_MQ_TIMEOUT = 300.0
DEFAULT_HEARTBEAT_INTERVAL = 10.0


@dataclass(frozen=True)
class ConnectorConfig:
    url: str
    mq_timeout: float
    heartbeat_interval: float


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
    url = f"{host if '://' in host else 'tcp://' + host}:{port}"
    return ConnectorConfig(
        url,
        _number(extra, "lmcache.mp.mq_timeout", DEFAULT_MQ_TIMEOUT),
        _number(extra, "lmcache.mp.heartbeat_interval", DEFAULT_HEARTBEAT_INTERVAL),
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
