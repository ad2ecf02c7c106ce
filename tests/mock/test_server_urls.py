"""The stand-in reads `lmcache.mp.server_urls` as lmcache 0.5.6's connector does (lmcache/integration/vllm/
lmcache_mp_connector.py:626-653): a list or a comma-separated string, preferred over host and port, bare host:port
given tcp://."""

from __future__ import annotations

import json

import pytest

from glm53.errors import Glm53Error
from glm53.mock.connector import parse_connector_config


def config(extra: dict[str, object]) -> str:
    return json.dumps({"kv_connector": "LMCacheMPConnector", "kv_connector_extra_config": extra})


@pytest.mark.parametrize(
    "urls",
    [["tcp://127.0.0.1:5560", " 127.0.0.1:5561 ", ""], "tcp://127.0.0.1:5560, 127.0.0.1:5561,"],
)
def test_server_urls_win_over_host_and_port(urls: object) -> None:
    parsed = parse_connector_config(
        config({"lmcache.mp.host": "tcp://x", "lmcache.mp.port": 1, "lmcache.mp.server_urls": urls})
    )
    assert parsed.urls == ("tcp://127.0.0.1:5560", "tcp://127.0.0.1:5561")
    assert parsed.url == "tcp://127.0.0.1:5560"


def test_without_server_urls_the_one_server_is_host_and_port() -> None:
    parsed = parse_connector_config(config({"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 5555}))
    assert parsed.urls == ("tcp://127.0.0.1:5555",)


def test_server_urls_of_another_type_are_one_line() -> None:
    with pytest.raises(Glm53Error) as error:
        parse_connector_config(config({"lmcache.mp.server_urls": 5560}))
    assert (
        error.value.message == "kv_connector_extra_config lmcache.mp.server_urls must be a list or a string, got 5560"
    )
