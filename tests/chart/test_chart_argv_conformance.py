"""The chart's rendered command lines parse with vLLM 0.33.0's and LMCache 0.5.6's own parsers and mean what it intends.

For every `ci/` scenario the engine's `vllm serve` argv and the sidecar's `lmcache server` argv are taken from the
rendered pod and parsed by the released packages (`upstream_parse.py`; for vLLM in the venv that
`scripts/setup.d/25-upstream-parsers.sh` builds, for LMCache in the project's .venv). A flag either parser rejects fails
here. The parsed values are then held against the chart's intent: TP size, prefix caching, KV-cache dtype, the connector
dialling exactly where the server listens, loopback binds, /run_script off, the chunk size. The extra-argument bypasses
of issue 12 are shown with the same parsers: placed where the chart puts extra arguments (before its own flags), none
takes effect.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from glm53.pod.main_job import lmcache_overlay
from glm53.profiles import LMCACHE_DEFAULT_CHUNK_SIZE, get_profile
from tests.support.chartkit import (
    NEXT_VLLM,
    REPO_ROOT,
    Obj,
    at_vllm,
    container,
    get,
    pod_spec,
    render,
    scenario_values,
    scenarios,
    vllm_next_scenarios,
)

PARSE = REPO_ROOT / "tests" / "support" / "upstream_parse.py"
# vllm.generation's default; the opt-in NEXT_VLLM (0.34.0) is parsed by its own release.
DEFAULT_VLLM = "0.33.0"
# The project's .venv carries the real lmcache==0.5.6 (the `pod` extra): its parser imports there.
LMCACHE_PYTHON = Path(sys.executable)
# A negotiating sidecar (lmcache.generation=0.5.7rc2) is parsed by the negotiating release, lmcache 0.5.7rc2, from the
# overlay scripts/setup.d/26-lmcache-negotiating.sh installs: 0.5.6's parser has no --api-key-file.
NEGOTIATING_OVERLAY = lmcache_overlay("0.5.7rc2")
# `glm53 mock vllm` takes vLLM's flags plus its own knobs; these are the stand-in's, not vLLM's.
MOCK_ONLY_FLAGS = ("--profile", "--load-seconds")

pytestmark = pytest.mark.slow


def vllm_python(generation: str) -> Path:
    """The conformance venv of one vLLM release (scripts/setup.d/25-upstream-parsers.sh)."""
    return REPO_ROOT / ".tools" / f"upstream-parsers-venv-{generation}" / "bin" / "python"


def upstream_parse(
    tool: str, argvs: Sequence[Any], overlay: Path | None = None, generation: str = DEFAULT_VLLM
) -> list[dict[str, Any]]:
    """Parse every argv with the released parser of `tool` in one process (vLLM's import takes seconds); `overlay`
    first on PYTHONPATH shadows the environment's release of it; `generation` picks the vLLM release."""
    python = vllm_python(generation) if tool.startswith("vllm") else LMCACHE_PYTHON
    assert python.exists(), f"{python} missing; run `bash scripts/setup.d/25-upstream-parsers.sh` first"
    env = dict(os.environ)
    if overlay is not None:
        assert overlay.is_dir(), f"{overlay} missing; run `bash scripts/setup.d/26-lmcache-negotiating.sh` first"
        env["PYTHONPATH"] = str(overlay)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        done = subprocess.run(
            [str(python), str(PARSE), tool, str(out)],
            input=json.dumps(argvs),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


def program_argv(c: Obj, program: Sequence[str]) -> list[str]:
    """The argv after `program` in a container run as `glm53 supervise --log FILE -- PROGRAM ARGS`."""
    args: list[str] = c["args"]
    start = args.index("--") + 1
    assert args[start : start + len(program)] == list(program), args
    return args[start + len(program) :]


# The real CPU engine (mock.engine=vllm) starts as a module whose parser takes the model as `--model`; `vllm serve`
# takes the same flag, so its argv parses as what follows `vllm serve`.
REAL_CPU_ENGINE = ("python3", "-m", "vllm.entrypoints.openai.api_server")


def engine_argv(objs: list[Obj]) -> list[str]:
    """What follows `vllm serve` (for the stand-in: its argv without its own flags)."""
    vllm = container(objs, "vllm")
    if "vllm.entrypoints.openai.api_server" in vllm["args"]:
        return program_argv(vllm, REAL_CPU_ENGINE)
    if "mock" in vllm["args"]:
        argv = program_argv(vllm, ("glm53", "mock", "vllm"))
        for flag in MOCK_ONLY_FLAGS:
            i = argv.index(flag)
            del argv[i : i + 2]
        return argv
    return program_argv(vllm, ("vllm", "serve"))


def sidecar_argv(objs: list[Obj]) -> list[str]:
    return program_argv(container(objs, "lmcache"), ("lmcache", "server"))


@functools.cache
def scenario_objs(name: str) -> list[Obj]:
    return render(scenario_values(name))


# (extra arguments, what the parsed result must still show). Appended after the chart's flags (where extra arguments
# used to go), each undoes a guard; prepended (where the chart now puts them), the chart's value stays in force.
BYPASSES: dict[str, list[tuple[list[str], str, Any]]] = {
    "lmcache": [
        (["--run-s"], "mp.run_script_api_enabled", False),
        (["--run-script-api"], "mp.run_script_api_enabled", False),
        (["--http-h", "0.0.0.0"], "http.http_host", "127.0.0.1"),
        (["--host=0.0.0.0"], "mp.host", "127.0.0.1"),
        (["--chunk", "256"], "mp.chunk_size", 1152),
    ],
    "vllm": [
        (["--kv-cache-dtype", "fp8"], "engine.kv_cache_dtype", "auto"),
        (["--no-enable-prefix-caching"], "engine.enable_prefix_caching", True),
        (["-tp", "2"], "engine.tensor_parallel_size", 4),
        (["--tensor_parallel_size=2"], "engine.tensor_parallel_size", 4),
        (["--no-enable-prompt-tokens-details"], "args.enable_prompt_tokens_details", True),
    ],
}


@pytest.mark.parametrize("tool", ["lmcache", "vllm"])
def test_last_wins_keeps_the_charts_flags_where_extra_arguments_go(tool: str) -> None:
    results = parsed(tool)
    for i, (extra, path, kept) in enumerate(BYPASSES[tool]):
        section, key = path.split(".")
        assert results[f"before:{i}"]["ok"][section][key] == kept, (extra, "placed before the chart's flags")
        # Why the guard refuses these at render time: after the chart's flags the same words win.
        assert results[f"after:{i}"]["ok"][section][key] != kept, (extra, "placed after the chart's flags")


HARMLESS = {"vllm": {"extraArgs": ["--max-model-len", "65536"]}, "lmcache": {"extraArgs": ["--max-workers=2"]}}
# Argvs the parsers must refuse: the harness reports a refusal rather than a pass.
REJECTED = {
    "vllm": (["zai-org/GLM-5.3", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    "lmcache": (["--eviction-policy", "LRU", "--l1-size-gb", "1", "--http-port", "x"], "invalid int value: 'x'"),
}


# Each lmcache.l2 choice, and what LMCache's own parser must build from the rendered `--l2-adapter` (its type's
# from_dict, lmcache 0.5.6 l2_adapters/config.py:447-500): the chart's default fs tier, a shared Redis with auth (the
# password comes from the environment, never the argv), and none.
L2_REDIS = {"host": "redis.cache.svc", "port": 6380, "numWorkers": 4, "auth": {"secretName": "glm53-l2-redis"}}
L2_TIERS: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "fs": (
        {"type": "fs"},
        [{"class": "FSL2AdapterConfig", "base_path": "/var/cache/glm53/lmcache-l2", "use_odirect": False}],
    ),
    "resp": (
        {"type": "resp", "resp": L2_REDIS},
        [{"class": "RESPL2AdapterConfig", "host": "redis.cache.svc", "port": 6380, "num_workers": 4, "password": ""}],
    ),
    "off": ({"type": "off"}, []),
}


def chart_argv(tool: str, objs: list[Obj]) -> list[str]:
    return engine_argv(objs) if tool == "vllm" else sidecar_argv(objs)


def cases(tool: str) -> dict[str, list[str]]:
    """Every argv this module parses with `tool`, by case name: one parser process per tool (vLLM imports slowly)."""
    found = {f"scenario:{name}": chart_argv(tool, scenario_objs(name)) for name in scenarios()}
    base = chart_argv(tool, scenario_objs("default"))
    positional = 1 if tool == "vllm" else 0  # vLLM's model tag comes first
    for i, (extra, _, _) in enumerate(BYPASSES[tool]):
        found[f"after:{i}"] = [*base, *extra]
        found[f"before:{i}"] = [*base[:positional], *extra, *base[positional:]]
    found["harmless"] = chart_argv(tool, render(HARMLESS))
    if tool == "lmcache":
        found.update(
            {f"l2:{name}": sidecar_argv(render({"lmcache": {"l2": l2}})) for name, (l2, _) in L2_TIERS.items()}
        )
    found["rejected"] = REJECTED[tool][0]
    return found


@functools.cache
def parsed(tool: str) -> dict[str, dict[str, Any]]:
    named = cases(tool)
    return dict(zip(named, upstream_parse(tool, list(named.values())), strict=True))


def is_negotiating(values: Mapping[str, Any]) -> bool:
    return bool(_value(values, "lmcache.generation", "0.5.6") != "0.5.6")


@functools.cache
def parsed_negotiating() -> dict[str, dict[str, Any]]:
    """The negotiating scenarios' sidecars, parsed by lmcache 0.5.7rc2."""
    named = {
        f"scenario:{n}": chart_argv("lmcache", scenario_objs(n))
        for n in scenarios()
        if is_negotiating(scenario_values(n))
    }
    return dict(zip(named, upstream_parse("lmcache", list(named.values()), NEGOTIATING_OVERLAY), strict=True))


def _value(values: Mapping[str, Any], path: str, default: Any) -> Any:
    node: Any = values
    for key in path.split("."):
        if not isinstance(node, Mapping) or node.get(key) is None:
            return default
        node = node[key]
    return node


@functools.cache
def parsed_next() -> dict[str, dict[str, Any]]:
    """The 0.34.0 scenarios' engine argvs parsed by vLLM 0.34.0, and their engine containers' environments checked by
    its validate_environ; plus the environments the chart refuses for 0.34.0, which 0.34.0 must refuse too."""
    objs = {name: render(at_vllm(scenario_values(name), NEXT_VLLM)) for name in vllm_next_scenarios()}
    argvs = {f"scenario:{name}": engine_argv(o) for name, o in objs.items()}
    envs = {f"env:{name}": container_environment(o) for name, o in objs.items()}
    envs |= {f"refused:{name}": {name: value} for name, value in NEXT_REFUSED_ENV.items()}
    return dict(zip(argvs, upstream_parse("vllm", list(argvs.values()), generation=NEXT_VLLM), strict=True)) | dict(
        zip(envs, upstream_parse("vllm-environ", list(envs.values()), generation=NEXT_VLLM), strict=True)
    )


def container_environment(objs: list[Obj]) -> dict[str, str]:
    """The vLLM container's environment as its process sees it (a value from a Secret stands as "secret")."""
    return {e["name"]: e.get("value", "secret") for e in container(objs, "vllm").get("env", [])}


# What the chart refuses for 0.34.0 (templates/_guards.tpl, glm53.refuseVllmNextEnv), by an example value each.
NEXT_REFUSED_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_MARLIN_INPUT_DTYPE": "int8"}


@pytest.mark.parametrize("name", scenarios())
def test_engine_argv_parses_with_vllm_and_means_what_the_chart_intends(name: str) -> None:
    assert_engine_means_what_the_chart_intends(parsed("vllm")[f"scenario:{name}"], scenario_values(name), name)


@pytest.mark.parametrize("name", vllm_next_scenarios())
def test_at_vllm_034_the_engine_argv_parses_and_keeps_the_extensible_kv_cache_off(name: str) -> None:
    result = parsed_next()[f"scenario:{name}"]
    assert_engine_means_what_the_chart_intends(result, scenario_values(name), name, NEXT_VLLM)
    # An explicit False stays off whatever the connector declares (vllm 0.34.0 config/vllm.py:3194-3252); the
    # default, None, would turn it on on CUDA for a connector configured with kv_connector_module_path.
    assert result["ok"]["engine"]["enable_extensible_kv_cache"] is False


@pytest.mark.parametrize("name", vllm_next_scenarios())
def test_at_vllm_034_the_engine_environment_passes_vllms_own_check(name: str) -> None:
    result = parsed_next()[f"env:{name}"]
    assert "ok" in result, f"vLLM {NEXT_VLLM} refuses the {name} engine environment: {result.get('error')}"


def test_vllm_034_refuses_the_environment_the_chart_refuses_and_nothing_else_is_removed() -> None:
    results = parsed_next()
    for name in NEXT_REFUSED_ENV:
        assert "ValueError" in results[f"refused:{name}"].get("error", ""), (name, results[f"refused:{name}"])
    removed = results[f"env:{vllm_next_scenarios()[0]}"]["ok"]["removed"]
    assert sorted(set(NEXT_REFUSED_ENV) - {"VLLM_USE_V2_MODEL_RUNNER"}) == removed


def assert_engine_means_what_the_chart_intends(
    result: dict[str, Any], values: Mapping[str, Any], name: str, generation: str = DEFAULT_VLLM
) -> None:
    assert "ok" in result, f"vLLM {generation} rejects the {name} engine argv: {result.get('error')}"
    args, engine = result["ok"]["args"], result["ok"]["engine"]
    profile = get_profile(values.get("profile", "glm53-flash"))
    if _value(values, "mock.engine", "standin") == "vllm":  # the tiny model the init container makes, by its name
        assert (engine["model"], engine["served_model_name"]) == (f"/models/{profile.name}", [profile.model_id])
    else:
        assert engine["model"] == profile.model_id
    assert (args["host"], args["port"]) == ("0.0.0.0", 8000)
    assert engine["tensor_parallel_size"] == _value(values, "vllm.tensorParallelSize", profile.tensor_parallel_size)
    assert engine["enable_prefix_caching"] is True
    assert engine["kv_cache_dtype"] == _value(values, "vllm.kvCacheDtype", "auto")
    assert args["enable_prompt_tokens_details"] is True
    # The router tokenizes through the render routes, which vLLM serves only with --enable-scale-out.
    assert args["enable_scale_out"] is bool(_value(values, "router.enabled", False))
    kv = engine["kv_transfer_config"]
    assert (kv["kv_connector"], kv["kv_role"]) == ("LMCacheMPConnector", "kv_both")
    events = engine["kv_events_config"]
    if _value(values, "router.enabled", False) and _value(values, "router.policy", "") == "kv_aware":
        port = _value(values, "router.kvAware.eventsPort", 5557)
        assert (events["enable_kv_cache_events"], events["publisher"]) == (True, "zmq")
        assert events["endpoint"] == f"tcp://*:{port}"
    else:
        assert events is None or events["enable_kv_cache_events"] is False
    if _value(values, "vllm.speculativeDecoding.enabled", False):
        assert engine["speculative_config"] == {
            "method": "mtp",
            "num_speculative_tokens": profile.mtp_speculative_tokens,
        }
    else:
        assert engine["speculative_config"] is None


@pytest.mark.parametrize("name", scenarios())
def test_sidecar_argv_parses_with_lmcache_and_keeps_the_server_private(name: str) -> None:
    values = scenario_values(name)
    release, parsed_sidecars = (
        ("0.5.7rc2", parsed_negotiating()) if is_negotiating(values) else ("0.5.6", parsed("lmcache"))
    )
    engine_result, result = parsed("vllm")[f"scenario:{name}"], parsed_sidecars[f"scenario:{name}"]
    assert "ok" in result, f"LMCache {release} rejects the {name} sidecar argv: {result.get('error')}"
    mp, http, args = result["ok"]["mp"], result["ok"]["http"], result["ok"]["args"]
    profile = get_profile(values.get("profile", "glm53-flash"))
    assert mp["run_script_api_enabled"] is False
    assert (mp["host"], http["http_host"]) == ("127.0.0.1", "127.0.0.1")
    assert mp["transport"] == "zmq"
    # A negotiating build gets no --chunk-size: the server starts from its default minimum and rounds up.
    negotiating = is_negotiating(values) and _value(values, "lmcache.chunkSize", None) is None
    chunk = LMCACHE_DEFAULT_CHUNK_SIZE if negotiating else profile.recommended_chunk_size
    assert mp["chunk_size"] == _value(values, "lmcache.chunkSize", chunk)
    assert mp["separate_object_groups"] is _value(values, "lmcache.separateObjectGroups", True)
    l1 = _value(values, "mock.l1SizeGb", 1) if _value(values, "mock.enabled", False) else 100
    assert args["l1_size_gb"] == l1
    # The engine's connector dials exactly where the server listens.
    extra = engine_result["ok"]["engine"]["kv_transfer_config"]["kv_connector_extra_config"]
    assert (extra["lmcache.mp.host"], extra["lmcache.mp.port"]) == (f"tcp://{mp['host']}", mp["port"])
    # The sidecar's probes and the exporter use the HTTP port the server really serves (and /metrics on it).
    objs = scenario_objs(name)
    probe = get(container(objs, "lmcache"), "startupProbe.exec.command")[2]
    assert f"http://127.0.0.1:{http['http_port']}/healthcheck" in probe
    exporters = [c for c in pod_spec(objs)["containers"] if c["name"] == "exporter"]
    for exporter in exporters:
        lmcache_url = exporter["args"][exporter["args"].index("--lmcache-url") + 1]
        assert lmcache_url == f"http://127.0.0.1:{http['http_port']}"
    # The negotiating server's HTTP API takes the key from the mounted Secret; the exporter sends the same file's.
    key_files = mp.get("api_key_files", [])
    assert bool(key_files) is is_negotiating(values)
    for exporter in exporters:
        flag = "--lmcache-api-key-file"
        sent = [exporter["args"][exporter["args"].index(flag) + 1]] if flag in exporter["args"] else []
        assert sent == key_files


@pytest.mark.parametrize("tier", L2_TIERS)
def test_each_l2_tier_parses_with_lmcache_into_the_adapter_the_chart_means(tier: str) -> None:
    result = parsed("lmcache")[f"l2:{tier}"]
    assert "ok" in result, f"LMCache 0.5.6 rejects the {tier} tier's sidecar argv: {result.get('error')}"
    built = result["ok"]["l2"]
    expected = L2_TIERS[tier][1]
    assert [{k: b[k] for k in e} for b, e in zip(built, expected, strict=True)] == expected
    # With a tier, a chunk loaded from it stays in L1 (lmcache.l2.prefetchPolicy); without one, upstream's default.
    assert result["ok"]["args"]["l2_prefetch_policy"] == ("retain" if expected else "default")


def test_harmless_extra_arguments_render_parse_and_leave_the_guarded_values_alone() -> None:
    engine, sidecar = parsed("vllm")["harmless"]["ok"], parsed("lmcache")["harmless"]["ok"]
    assert (engine["engine"]["max_model_len"], engine["engine"]["tensor_parallel_size"]) == (65536, 4)
    assert (sidecar["args"]["max_workers"], sidecar["mp"]["run_script_api_enabled"]) == (2, False)


@pytest.mark.parametrize("tool", ["vllm", "lmcache"])
def test_the_parsers_reject_what_they_should(tool: str) -> None:
    """An unknown flag or a bad value fails the build instead of passing unparsed."""
    assert REJECTED[tool][1] in parsed(tool)["rejected"]["error"]
