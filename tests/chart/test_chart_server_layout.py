"""lmcache.serverLayout: one LMCache sidecar for the pod (default), or one per TP rank wired through the connector's
`lmcache.mp.server_urls`, each with its own ports, probes, log, L1 share and exporter target.

The wiring follows the released connector (lmcache 0.5.6 lmcache/integration/vllm/lmcache_mp_connector.py): the
server count is the list's length (:652-653), worker r talks to `server_urls[r // (world_size // n_servers)]`
(:759-762), and world_size % n_servers must be 0 (:675-678); the chart renders exactly one URL per rank, in rank order.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.support.chartkit import (
    Obj,
    RenderError,
    assert_refused,
    container,
    flag_value,
    get,
    one,
    pod_spec,
    render,
    render_cli,
)

PER_RANK = {"lmcache": {"serverLayout": "perRank"}}
LOGS = "/var/log/glm53"


def sidecars(objs: list[Obj]) -> list[Obj]:
    return [c for c in pod_spec(objs).get("initContainers", []) if c["name"].startswith("lmcache")]


def served(c: Obj) -> list[str]:
    """The server's argv after `glm53 supervise ... --`."""
    args: list[str] = c["args"]
    return args[args.index("--") + 1 :]


def kv_extra(objs: list[Obj]) -> dict[str, Any]:
    config = json.loads(flag_value(container(objs, "vllm")["args"], "--kv-transfer-config"))
    extra: dict[str, Any] = config["kv_connector_extra_config"]
    return extra


def health_url(probe: Obj) -> str:
    script = probe["exec"]["command"][2]
    return str(script.split('r.urlopen("', 1)[1].split('"', 1)[0])


def test_the_default_is_one_sidecar_on_the_pods_ports() -> None:
    objs = render({})
    (only,) = sidecars(objs)
    assert only["name"] == "lmcache"
    args = served(only)
    assert (flag_value(args, "--port"), flag_value(args, "--http-port"), flag_value(args, "--l1-size-gb")) == (
        "5555",
        "8080",
        "100",
    )
    extra = kv_extra(objs)
    assert (extra["lmcache.mp.host"], extra["lmcache.mp.port"]) == ("tcp://127.0.0.1", 5555)
    assert "lmcache.mp.server_urls" not in extra


@pytest.mark.parametrize(
    ("profile", "tp", "l1", "memory"), [("glm53-flash", 4, "25", "33Gi"), ("glm53", 8, "12.5", "21Gi")]
)
def test_per_rank_runs_one_server_per_tp_rank_each_on_its_own_ports_log_and_l1_share(
    profile: str, tp: int, l1: str, memory: str
) -> None:
    objs = render({**PER_RANK, "profile": profile})
    servers = sidecars(objs)
    assert [c["name"] for c in servers] == [f"lmcache-{i}" for i in range(tp)]
    init_names = [c["name"] for c in pod_spec(objs)["initContainers"]]
    assert init_names.index("lmcache-0") < init_names.index(f"lmcache-{tp - 1}")  # started in rank order, before vLLM
    for i, c in enumerate(servers):
        assert c["restartPolicy"] == "Always"
        assert c["args"][:2] == ["--log", f"{LOGS}/lmcache-{i}.log"]
        args = served(c)
        assert args[:2] == ["lmcache", "server"]
        assert flag_value(args, "--host") == flag_value(args, "--http-host") == "127.0.0.1"
        assert (flag_value(args, "--port"), flag_value(args, "--http-port")) == (str(5560 + i), str(8090 + i))
        assert flag_value(args, "--l1-size-gb") == l1  # lmcache.l1SizeGb (100) / TP
        assert args[-1] == "--no-run-script-api-enabled"
        for probe in ("startupProbe", "livenessProbe"):
            assert health_url(c[probe]) == f"http://127.0.0.1:{8090 + i}/healthcheck"
        assert get(c, "resources.requests.memory") == get(c, "resources.limits.memory") == memory
        assert get(c, "resources.requests.cpu") == "1" and "cpu" not in get(c, "resources.limits")
    assert memory == f"{math.ceil(100 / tp) + 8}Gi"  # the L1 share plus lmcache.memoryOverheadGi, per server


def test_per_rank_gives_the_connector_one_url_per_rank_in_rank_order_and_no_single_server() -> None:
    extra = kv_extra(render(PER_RANK))
    assert extra["lmcache.mp.server_urls"] == [f"tcp://127.0.0.1:{5560 + i}" for i in range(4)]
    assert "lmcache.mp.host" not in extra and "lmcache.mp.port" not in extra
    # The connector maps worker r to server_urls[r // (world_size // n_servers)]: with TP URLs, rank r -> server r.
    urls = extra["lmcache.mp.server_urls"]
    assert [urls[rank // (4 // len(urls))] for rank in range(4)] == urls


def test_the_url_count_follows_another_tp_size() -> None:
    values = {**PER_RANK, "profile": "glm53", "vllm": {"tensorParallelSize": 4}}
    values["allowUnverified"] = {"tensorParallelSize": True}
    objs = render(values)
    assert len(kv_extra(objs)["lmcache.mp.server_urls"]) == 4
    assert [c["name"] for c in sidecars(objs)] == ["lmcache-0", "lmcache-1", "lmcache-2", "lmcache-3"]


def test_the_engines_startup_probe_reads_every_servers_log_and_the_exporter_scrapes_every_server() -> None:
    objs = render({**PER_RANK, "exporter": {"enabled": True}})
    probe = container(objs, "vllm")["startupProbe"]["exec"]["command"]
    logs = [probe[i + 1] for i, part in enumerate(probe) if part == "--log"]
    assert logs == [f"{LOGS}/vllm.log", *(f"{LOGS}/lmcache-{i}.log" for i in range(4))]
    exporter = container(objs, "exporter")["args"]
    assert [exporter[i + 1] for i, part in enumerate(exporter) if part == "--lmcache-url"] == [
        f"http://127.0.0.1:{8090 + i}" for i in range(4)
    ]
    assert [exporter[i + 1] for i, part in enumerate(exporter) if part == "--log"] == logs


def test_the_service_monitor_scrapes_the_exporter_which_sees_every_server() -> None:
    objs = render({**PER_RANK, "exporter": {"enabled": True}, "monitoring": {"serviceMonitor": {"enabled": True}}})
    ports = {e["port"] for e in one(objs, "ServiceMonitor")["spec"]["endpoints"]}
    assert "metrics" in ports  # the exporter's port: LMCache's admin ports stay on loopback


def test_mock_mode_splits_the_mock_l1_and_keeps_the_mock_resources() -> None:
    objs = render({**PER_RANK, "mock": {"enabled": True}, "weights": {"source": "none"}})
    for c in sidecars(objs):
        assert flag_value(served(c), "--l1-size-gb") == "0.25"
        assert get(c, "resources.limits.memory") == "2Gi"
    assert kv_extra(objs)["lmcache.mp.mp_transfer_mode"] == "lmcache_driven"


def test_no_server_template_is_copied_the_layouts_differ_only_in_what_the_list_says() -> None:
    one_server, four = sidecars(render({}))[0], sidecars(render(PER_RANK))[0]
    differing = {key for key in one_server if one_server[key] != four[key]}
    assert differing == {"name", "args", "startupProbe", "livenessProbe", "resources"}
    assert set(one_server) == set(four)


def test_the_per_rank_ports_are_reserved() -> None:
    with pytest.raises(RenderError) as error:
        render({**PER_RANK, "exporter": {"enabled": True, "port": 8091}})
    assert "exporter.port=8091 collides with a port the pod's containers already use" in error.value.message
    assert render({"exporter": {"enabled": True, "port": 8091}})  # free with one server


MESSAGE = (
    "lmcache.serverLayout=perRank with lmcache.enabled=false: there are no LMCache servers to run one per rank; set "
    "lmcache.enabled=true, or leave lmcache.serverLayout at pod"
)


def test_per_rank_without_lmcache_is_refused_by_both_helm_engines() -> None:
    values = {"lmcache": {"serverLayout": "perRank", "enabled": False}}
    assert_refused(values, MESSAGE)


def test_the_schema_knows_only_the_two_layouts() -> None:
    with pytest.raises(RenderError, match="values don't meet the specifications of the schema") as error:
        render({"lmcache": {"serverLayout": "perNode"}})
    assert "serverLayout" in error.value.message


def test_helm_3_renders_the_same_per_rank_pod() -> None:
    assert [c["name"] for c in sidecars(render_cli(PER_RANK))] == [c["name"] for c in sidecars(render(PER_RANK))]
    assert kv_extra(render_cli(PER_RANK)) == kv_extra(render(PER_RANK))
