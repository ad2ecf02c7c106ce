"""The loopback runner's one rewrite (`glm53.pod.loopback.relocate`), the chart edge (`glm53.pod.chart`), and the
issue's rule: a flag changed in the chart's helpers changes what the main job runs, with no edit in `src/`.

The plans are the chart's own mock-mode pod, rendered in-process; relocations are written by hand so every moved
place can be named in an assertion (the runner's `relocation_for` only picks free ports for the same mapping).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from glm53.errors import EXIT_USAGE, Glm53Error
from glm53.pod import chart
from glm53.pod.contract import CHECKOUT_CHART, WEIGHTS_VOLUME
from glm53.pod.loopback import (
    EXIT_NOT_READY,
    LOCALHOST,
    SHM,
    Relocation,
    ephemeral_range_start,
    free_ports,
    listening_ports,
    prepare_volumes,
    relocate,
    relocation_for,
    remove_stale_kv_segments,
    service_url_on_loopback,
    wait_group_gone,
)
from glm53.pod.main_job import PodOptions, render_plans
from glm53.pod.plan import PodPlan, deployment_pod, pod_from_spec
from glm53.profiles import get_profile

MOCK_VALUES: dict[str, Any] = {"mock": {"enabled": True}, "weights": {"source": "none"}}
WITH_EXPORTER = {**MOCK_VALUES, "exporter": {"enabled": True}}
# The pod's ports (engine 8000, server ZMQ 5555 and HTTP 8080, exporter 9400) and where this test moves them.
MOVED = {5555: 15555, 8000: 18000, 8080: 18080, 9400: 19400}
# A flag neither `lmcache server` nor the engine stand-in knows: argparse refuses it at once.
UNKNOWN_FLAG = "--no-such-flag"


@pytest.fixture(scope="module")
def mock_pod() -> PodPlan:
    return deployment_pod(chart.render(WITH_EXPORTER))


def relocation(workdir: Path, ports: dict[int, int] | None = None) -> Relocation:
    """The chart's volumes under `workdir`, /dev/shm kept, as `relocation_for` would place them."""
    volumes = {name: workdir / name for name in ("logs", "tmp", "weights", "lmcache-l2")}
    return Relocation(MOVED if ports is None else ports, {**volumes, "shm": Path(SHM)})


def synthetic(args: list[str], env: dict[str, str] | None = None) -> PodPlan:
    spec = {"name": "c", "image": "x", "args": args, "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    return pod_from_spec("p", {"containers": [spec]})


def test_listening_ports_are_declared_ports_and_port_flags(mock_pod: PodPlan) -> None:
    assert listening_ports(mock_pod) == [5555, 8000, 8080, 9400]


def test_listening_ports_include_the_engines_kv_event_bind() -> None:
    values = {**MOCK_VALUES, "router": {"enabled": True, "policy": "kv_aware"}}
    # The router's own Deployment is rendered too; the loopback runner runs the engine's pod.
    pod = deployment_pod(chart.render(values))

    events = json.loads(pod.container("vllm").option("--kv-events-config"))
    assert events["endpoint"] == "tcp://*:5557"
    assert listening_ports(pod) == [5555, 5557, 8000, 8080]


def test_relocate_moves_ports_as_flag_values_urls_and_json(mock_pod: PodPlan, tmp_path: Path) -> None:
    moved = relocate(mock_pod, relocation(tmp_path))
    sidecar, engine, exporter = (moved.container(n) for n in ("lmcache", "vllm", "exporter"))

    assert (sidecar.option("--port"), sidecar.option("--http-port")) == ("15555", "18080")
    assert (engine.option("--port"), engine.port("http")) == ("18000", 18000)
    connector = json.loads(engine.option("--kv-transfer-config"))["kv_connector_extra_config"]
    assert connector == {
        "lmcache.mp.host": "tcp://127.0.0.1",
        "lmcache.mp.port": 15555,
        "lmcache.mp.mp_transfer_mode": "lmcache_driven",  # mock mode: LMCache's CPU path (POSIX SHM)
        "lmcache.mp.heartbeat_interval": 10,  # not a port: left alone
    }
    assert (exporter.option("--port"), exporter.port("metrics")) == ("19400", 19400)
    assert exporter.option("--vllm-url") == "http://127.0.0.1:18000"
    assert exporter.option("--lmcache-url") == "http://127.0.0.1:18080"
    # The probes' python -c scripts name the servers by URL.
    assert sidecar.startup_probe is not None and engine.readiness_probe is not None
    assert '"http://127.0.0.1:18080/healthcheck"' in sidecar.startup_probe.command[-1]
    assert '"http://127.0.0.1:18000/health"' in engine.readiness_probe.command[-1]
    assert '"http://127.0.0.1:18000/v1/models"' in engine.readiness_probe.command[-1]
    # Numbers that only contain a pod port are not ports.
    assert sidecar.option("--chunk-size") == "1152"


def test_relocate_binds_loopback_only(mock_pod: PodPlan, tmp_path: Path) -> None:
    moved = relocate(mock_pod, relocation(tmp_path))

    assert moved.container("vllm").option("--host") == "127.0.0.1"
    assert moved.container("exporter").option("--host") == "127.0.0.1"
    assert not [p for c in moved.containers for p in c.argv if "0.0.0.0" in p]


def test_relocate_moves_mount_paths_to_the_volume_dirs_and_drops_tini(mock_pod: PodPlan, tmp_path: Path) -> None:
    moved = relocate(mock_pod, relocation(tmp_path))
    logs = tmp_path / "logs"
    engine = moved.container("vllm")

    assert engine.argv[:4] == ("glm53", "supervise", "--log", str(logs / "vllm.log"))
    assert moved.container("lmcache").argv[:4] == ("glm53", "supervise", "--log", str(logs / "lmcache.log"))
    assert dict(engine.env)["HOME"] == str(tmp_path / "tmp")
    assert dict(engine.env)["HF_HOME"] == str(tmp_path / "weights" / "huggingface")
    assert engine.startup_probe is not None
    startup = engine.startup_probe.command
    assert startup[startup.index("--state-dir") + 1] == str(logs / ".probe")
    assert [startup[i + 1] for i, part in enumerate(startup) if part == "--log"] == [
        str(logs / "vllm.log"),
        str(logs / "lmcache.log"),
    ]
    # The exporter has no supervisor in front (nothing to drop), but reads the same logs.
    exporter = moved.container("exporter")
    assert exporter.argv[:4] == ("glm53", "exporter", "--log", str(logs / "vllm.log"))
    # The fs L2 tier's directory moves in the janitor's flag and inside the server's JSON adapter argument alike.
    sidecar = moved.container("lmcache")
    tier = str(tmp_path / "lmcache-l2")
    assert sidecar.option("--l2-dir") == tier
    assert json.loads(sidecar.option("--l2-adapter")) == {"base_path": tier, "type": "fs"}


def test_simultaneous_moves_swap_instead_of_moving_twice(mock_pod: PodPlan, tmp_path: Path) -> None:
    exporter = relocate(mock_pod, relocation(tmp_path, {8000: 9400, 9400: 8000})).container("exporter")

    assert exporter.option("--vllm-url") == "http://127.0.0.1:9400"
    assert exporter.option("--port") == "8000"


@pytest.mark.parametrize(
    ("args", "env", "where", "text"),
    [
        (["--dial", "x8000y"], {}, "the command of container 'c'", "x8000y"),
        (["serve", "port=8000"], {}, "the command of container 'c'", "port=8000"),
        ([], {"SERVER_PORT": "port 8000"}, "env SERVER_PORT of container 'c'", "port 8000"),
    ],
    ids=["inside-a-word", "after-equals", "in-env"],
)
def test_a_port_the_rules_cannot_move_is_one_line(args: list[str], env: dict[str, str], where: str, text: str) -> None:
    with pytest.raises(Glm53Error) as error:
        relocate(synthetic(args, env), Relocation({8000: 18000}, {}))
    assert error.value.message == (
        f"port 8000 appears in {where} as {text!r}, where the loopback runner cannot move it; "
        "name ports as flag values or host:port in the chart's helpers"
    )


def test_relocation_for_gives_every_port_a_free_one_and_every_empty_dir_a_dir(
    mock_pod: PodPlan, tmp_path: Path
) -> None:
    found = relocation_for(mock_pod, tmp_path)

    assert sorted(found.ports) == listening_ports(mock_pod)
    assert len(set(found.ports.values())) == len(found.ports)
    assert dict(found.volumes) == dict(relocation(tmp_path).volumes)


def test_a_shared_volume_is_the_given_directory_and_is_kept(mock_pod: PodPlan, tmp_path: Path) -> None:
    # A fleet's replicas share the weights (a cluster's pods mount one claim): the model one replica made stays.
    weights = tmp_path / "fleet-weights"
    weights.mkdir()
    (weights / "model").write_text("made by replica 0")
    found = relocation_for(mock_pod, tmp_path / "replica-1", shared_volumes={WEIGHTS_VOLUME: weights})
    assert found.volumes[WEIGHTS_VOLUME] == weights and found.shared == {WEIGHTS_VOLUME}
    others = {name: path for name, path in found.volumes.items() if name != WEIGHTS_VOLUME}
    assert others == {n: p for n, p in relocation(tmp_path / "replica-1").volumes.items() if n != WEIGHTS_VOLUME}
    prepare_volumes(found, tmp_path / "replica-1")
    assert (weights / "model").read_text() == "made by replica 0"
    assert f"{WEIGHTS_VOLUME} -> {weights} (shared)" in found.describe()[1]

    with pytest.raises(Glm53Error) as error:
        relocation_for(mock_pod, tmp_path, shared_volumes={"models": weights})
    assert error.value.message == f"pod {mock_pod.name!r} has no emptyDir volume 'models' to share"


def test_relocation_for_refuses_a_volume_that_is_not_an_empty_dir(tmp_path: Path) -> None:
    # Mock mode loads no weights, but an existing claim is still mounted: no directory here can stand in for it.
    values = {"mock": {"enabled": True}, "weights": {"source": "existingPvc", "existingClaim": "glm53-weights"}}
    pod = deployment_pod(chart.render(values))
    with pytest.raises(Glm53Error) as error:
        relocation_for(pod, tmp_path)
    assert error.value.message == (
        "volume 'weights' of pod 'glm53-flash' is not an emptyDir or a Secret's listed keys; the loopback runner "
        "provides those only (render mock mode with weights.source=none)"
    )


# The negotiating generation on the real CPU engine: its server's API key comes from a Secret volume, and the mock
# image's overlay of that LMCache is on every container's PYTHONPATH.
NEGOTIATING_VALUES: dict[str, Any] = {
    **WITH_EXPORTER,
    "profile": "tiny-hybrid",
    "mock": {"enabled": True, "engine": "vllm"},
    "lmcache": {"generation": "0.5.7rc2", "apiKey": {"secretName": "glm53-lmcache-api-key"}},
}


def test_a_secret_volume_gets_a_fresh_random_key_readable_by_this_user_only(tmp_path: Path) -> None:
    pod = deployment_pod(chart.render(NEGOTIATING_VALUES))
    found = relocation_for(pod, tmp_path)
    assert found.secrets == {"lmcache-api-key": ("api-key",)}

    keys = []
    for _ in range(2):
        prepare_volumes(found, tmp_path)
        key_file = found.volumes["lmcache-api-key"] / "api-key"
        assert key_file.stat().st_mode & 0o777 == 0o400
        keys.append(key_file.read_text())
    assert all(len(key) == 49 and key.endswith("\n") and int(key, 16) for key in keys), keys
    assert keys[0] != keys[1]  # a new pod, a new Secret
    # The server and the exporter read the file the runner wrote.
    moved = relocate(pod, found)
    sidecar, exporter = moved.container("lmcache"), moved.container("exporter")
    assert sidecar.option("--api-key-file") == exporter.option("--lmcache-api-key-file") == str(key_file)


def test_the_images_venv_is_this_interpreters_so_the_generations_overlay_is_found(tmp_path: Path) -> None:
    pod = deployment_pod(chart.render(NEGOTIATING_VALUES))
    assert dict(pod.container("lmcache").env)["PYTHONPATH"] == "/opt/glm53/lmcache-0.5.7rc2"
    moved = relocate(pod, relocation_for(pod, tmp_path))
    for name in ("lmcache", "vllm"):  # the server and the engine's connector import the same LMCache
        assert dict(moved.container(name).env)["PYTHONPATH"] == str(Path(sys.prefix) / "lmcache-0.5.7rc2")
    # The released default sets no PYTHONPATH at all.
    default = deployment_pod(chart.render({**NEGOTIATING_VALUES, "lmcache": {}}))
    assert all("PYTHONPATH" not in dict(c.env) for c in default.containers)


def test_service_url_on_loopback_keeps_scheme_and_path() -> None:
    assert service_url_on_loopback("http://glm53-flash:8000", 18000) == "http://127.0.0.1:18000"
    assert service_url_on_loopback("http://svc.ns.svc:8000/v1", 18000) == "http://127.0.0.1:18000/v1"


def test_a_chart_guard_is_one_line_without_helms_template_position() -> None:
    with pytest.raises(Glm53Error) as error:
        chart.render({"mock": {"enabled": True}, "lmcache": {"chunkSize": 256}})
    message = error.value.message
    assert message.startswith("the chart refused the values: lmcache.chunkSize=256 is not a multiple of"), message
    assert "execution error" not in message and "\n" not in message


def test_a_directory_without_chart_yaml_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(Glm53Error) as error:
        chart.render(MOCK_VALUES, tmp_path)
    assert error.value.message == (
        f"no Helm chart at {tmp_path} (Chart.yaml missing); run from a checkout of glm53-serving or pass --chart"
    )
    assert error.value.exit_code == EXIT_USAGE


# The rule: the chart's helpers are the pod's one definition, so a flag added there reaches the main job.


def chart_with_flag(tmp_path: Path, helper: str, flag: str) -> Path:
    """A copy of the checkout's chart whose helper `helper` passes `flag` before its `--host`."""
    copy = tmp_path / "glm53"
    shutil.copytree(CHECKOUT_CHART, copy)
    define = f'{{{{- define "{helper}" -}}}}'
    (helpers,) = [path for path in (copy / "templates").rglob("_*.tpl") if define in path.read_text()]
    text = helpers.read_text()
    start = text.index(define)
    end = text.index("\n{{- end }}\n", start)
    anchor = text.index('(list "--host"', start)
    assert anchor < end, f"{helper} no longer passes --host through a list; update this test's edit"
    helpers.write_text(f'{text[:anchor]}(list "{flag}" {text[anchor + len("(list ") :]}')
    return copy


@pytest.mark.parametrize(
    ("helper", "container_name"), [("glm53.lmcacheServerArgs", "lmcache"), ("glm53.vllmServeArgs", "vllm")]
)
def test_a_flag_added_in_the_charts_helpers_is_in_the_main_jobs_plan(
    tmp_path: Path, helper: str, container_name: str
) -> None:
    profile = get_profile("glm53-flash")
    before = render_plans(PodOptions(profile)).serving.container(container_name)
    after = render_plans(PodOptions(profile, chart=chart_with_flag(tmp_path, helper, UNKNOWN_FLAG)))

    served = after.serving.container(container_name).served_argv
    assert UNKNOWN_FLAG not in before.served_argv
    assert served[served.index(UNKNOWN_FLAG) + 1] == "--host", served


@pytest.mark.slow
def test_the_main_job_runs_what_the_charts_helpers_say(tmp_path: Path) -> None:
    """`glm53 pod` on a chart whose sidecar gets a flag the real server refuses: the pod never becomes Ready."""
    copy = chart_with_flag(tmp_path, "glm53.lmcacheServerArgs", UNKNOWN_FLAG)
    workdir = tmp_path / "work"
    result = subprocess.run(
        [sys.executable, "-m", "glm53", "pod", "--engine", "standin", "--chart", str(copy), "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )

    assert result.returncode == EXIT_NOT_READY, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("glm53 pod: error:")]
    assert error.startswith("glm53 pod: error: lmcache exited with status 2 ("), error
    assert f"unrecognized arguments: {UNKNOWN_FLAG}" in error
    assert f"unrecognized arguments: {UNKNOWN_FLAG}" in (workdir / "containers" / "lmcache.log").read_text()
    # The sidecar never passed its startup probe, so the engine never started.
    assert not (workdir / "containers" / "vllm.log").exists()


def test_only_fresh_kv_segments_of_dead_processes_are_removed(tmp_path: Path) -> None:
    """LMCache leaves `lmcache_kv_<pid>_<n>` behind a stopped engine; a live pod's stay, and so do old ones."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    names = [f"lmcache_kv_{dead_pid}_0", f"lmcache_kv_{os.getpid()}_0", f"lmcache_kv_{dead_pid}_1", "psm_1"]
    for name in names:
        (tmp_path / name).write_bytes(b"kv")
    os.utime(tmp_path / names[2], (1.0, 1.0))  # from before the pod started
    assert remove_stale_kv_segments(tmp_path, since=1000.0) == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


def test_relocation_moves_every_per_rank_servers_ports_in_the_connectors_url_list(tmp_path: Path) -> None:
    """lmcache.serverLayout=perRank: four servers' ZMQ and HTTP ports, and the four URLs in lmcache.mp.server_urls
    (host:port inside the JSON), move together; nothing is left on a pod port."""
    plan = deployment_pod(
        chart.render({"mock": {"enabled": True}, "weights": {"source": "none"}, "lmcache": {"serverLayout": "perRank"}})
    )
    relocation = relocation_for(plan, tmp_path)
    moved = relocate(plan, relocation)
    config = json.loads(moved.container("vllm").option("--kv-transfer-config"))
    urls = config["kv_connector_extra_config"]["lmcache.mp.server_urls"]
    servers = moved.lmcache_servers()
    assert urls == [f"tcp://127.0.0.1:{c.option('--port')}" for c in servers]
    assert [c.option("--port") for c in servers] == [str(relocation.port(5560 + i)) for i in range(4)]
    assert len({relocation.port(p) for p in (*range(5560, 5564), *range(8090, 8094))}) == 8


def test_a_variable_from_a_secret_gets_the_value_it_was_created_with_else_a_fresh_one(tmp_path: Path) -> None:
    values = {**MOCK_VALUES, "lmcache": {"l2": {"type": "resp", "resp": {"host": "127.0.0.1", "port": 6380}}}}
    values["lmcache"]["l2"]["resp"]["auth"] = {"secretName": "glm53-l2-redis"}
    pod = deployment_pod(chart.render(values))
    assert pod.container("lmcache").secret_env == (("LMCACHE_RESP_PASSWORD", "glm53-l2-redis", "password"),)

    given = relocate(pod, relocation_for(pod, tmp_path, {("glm53-l2-redis", "password"): "s3cret"}))
    assert dict(given.container("lmcache").env)["LMCACHE_RESP_PASSWORD"] == "s3cret"
    assert given.container("lmcache").secret_env == ()
    made_up = relocation_for(pod, tmp_path).secret_values[("glm53-l2-redis", "password")]
    assert len(made_up) == 48 and made_up != relocation_for(pod, tmp_path).secret_values[("glm53-l2-redis", "password")]
    # The Redis port is no pod port: it stays as the chart rendered it.
    assert json.loads(given.container("lmcache").option("--l2-adapter"))["port"] == 6380


def test_free_ports_are_distinct_bindable_and_below_the_kernels_ephemeral_range() -> None:
    """Below it no outgoing connection's source port can take a port between this pick and its server's bind."""
    ports = free_ports(24)
    assert len(set(ports)) == 24
    assert all(10000 <= port < ephemeral_range_start() for port in ports), ports
    with contextlib.ExitStack() as stack:
        for port in ports:
            stack.enter_context(socket.socket()).bind((LOCALHOST, port))


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("glm53.pod.loopback.ephemeral_range_start", lambda: 1024)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(port >= 1024 for port in ports)


def test_a_killed_group_is_waited_for_until_its_last_member_is_gone() -> None:
    """The leader reaped is not enough: its child, an orphan now, may still exist (and own its KV segment)."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()
    wait_group_gone(leader.pid, 10.0)
    with pytest.raises(ProcessLookupError):
        os.killpg(leader.pid, 0)
