"""The CPU-mock pod on this machine: the README's main job, run the way Kubernetes would run the real pod.

Order and checks mirror the chart. The LMCache mock starts first under `glm53 supervise` and must answer
`/healthcheck` (the native sidecar's startup probe) before the vLLM mock starts; `glm53 probe startup` is then run
every second against both log files, like the kubelet's startup probe with a failure budget, until it reports Ready;
then the readiness check (`/health`, `/v1/models`); then `glm53 validate`'s three checks; then the exporter container's
`/metrics` is read, as an operator would `curl` it, to show the geometry facts and hit ratios; then everything stops.

Every server runs in its own process group (a new session), so stopping is one signal per group — SIGTERM, then
SIGKILL after a grace period — and reaches the supervisor and the server it runs alike. Stopping happens in a
`finally` with SIGINT/SIGTERM ignored, so an interrupt, a failure or a passing run all leave no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.probe import EXIT_NOT_YET, EXIT_READY
from glm53.profiles import LMCACHE_DEFAULT_CHUNK_SIZE, ModelProfile
from glm53.validate.progress import Progress
from glm53.validate.report import ValidationReport
from glm53.validate.runner import ValidationConfig, run_validation

EXIT_NOT_READY = 3  # the pod never became Ready: a server died or the startup probe refused (kubelet: restart)
LOCALHOST = "127.0.0.1"
LOG_NAMES = ("vllm.log", "lmcache.log")
EXPORTER_LOG = "exporter.log"
# The exporter series the main job shows: the geometry facts and whether the cache pays off.
EXPORTER_HIGHLIGHTS = (
    "glm53_geometry_matches_profile",
    "glm53_probe_status",
    "glm53_effective_chunk_size_tokens",
    "glm53_scheduler_block_size_tokens",
    "glm53_prefix_cache_hit_ratio",
    "glm53_prefix_cache_hit_tokens_total",
    "glm53_strict_prefix_bound_achieved_ratio",
)


@dataclass(frozen=True)
class Timing:
    """How patient the pod is. The defaults keep the whole main job well under a minute on two cores."""

    # Simulated model load of the vLLM mock: long enough that the probe sees "not yet" before "Ready".
    load_seconds: float = 2.0
    # The kubelet's startupProbe: periodSeconds and failureThreshold.
    probe_period: float = 1.0
    probe_failure_threshold: int = 30
    # How long LMCache's /healthcheck and vLLM's readiness may take once their process is up.
    http_deadline: float = 20.0
    # terminationGracePeriodSeconds: SIGTERM, then SIGKILL after this long.
    grace_seconds: float = 5.0


@dataclass(frozen=True)
class PodPorts:
    """The pod's loopback ports (8000, 5555, 8080, 9090 in Kubernetes; free ones here, so runs never collide)."""

    vllm: int
    lmcache: int
    lmcache_http: int
    lmcache_metrics: int
    exporter: int

    @classmethod
    def free(cls) -> PodPorts:
        return cls(*free_ports(5))


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free on loopback, all distinct (the sockets are held open together)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOCALHOST, 0))
        return [sock.getsockname()[1] for sock in sockets]


@dataclass(frozen=True)
class PodSpec:
    profile: ModelProfile
    workdir: Path
    ports: PodPorts
    generation: str = "released"
    fault: str | None = None
    timing: Timing = field(default_factory=Timing)
    # A chunk size other than the one the generation implies (the wrong-chunk-size path: the probe must refuse it).
    chunk_size_override: int | None = None
    # Validation needs vLLM's dev-mode endpoints; False starts vLLM as production would (no /reset_prefix_cache).
    dev_mode: bool = True

    @property
    def tensor_parallel_size(self) -> int:
        return self.profile.tensor_parallel_size

    @property
    def lmcache_chunk_size(self) -> int | None:
        """The --chunk-size given to LMCache: explicit for the released 0.5.6 (it cannot negotiate), else the default.

        A negotiating server is left at its default minimum, as seed 000 recommends, and rounds it up itself.
        """
        if self.chunk_size_override is not None:
            return self.chunk_size_override
        if self.generation == "released" or self.profile.recommended_chunk_size == LMCACHE_DEFAULT_CHUNK_SIZE:
            return self.profile.recommended_chunk_size
        return None

    @property
    def vllm_url(self) -> str:
        return f"http://{LOCALHOST}:{self.ports.vllm}"

    @property
    def lmcache_health_url(self) -> str:
        return f"http://{LOCALHOST}:{self.ports.lmcache_http}/healthcheck"

    def log(self, name: str) -> Path:
        return self.workdir / name

    def lmcache_command(self) -> list[str]:
        chunk = [] if self.lmcache_chunk_size is None else ["--chunk-size", str(self.lmcache_chunk_size)]
        groups = ["--separate-object-groups"] if self.profile.separate_object_groups_required else []
        return [
            *_glm53("mock", "lmcache"),
            *("--host", LOCALHOST, "--port", str(self.ports.lmcache)),
            *chunk,
            *groups,
            *("--l1-size-gb", "1", "--eviction-policy", "LRU"),
            *("--http-host", LOCALHOST, "--http-port", str(self.ports.lmcache_http)),
            *("--prometheus-port", str(self.ports.lmcache_metrics)),
            *("--generation", self.generation),
        ]

    def vllm_command(self) -> list[str]:
        transfer = {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "lmcache.mp.host": f"tcp://{LOCALHOST}",
                "lmcache.mp.port": self.ports.lmcache,
            },
        }
        mm = self.profile.text_only_flag
        text_only = [mm.flag, mm.value] if mm.value is not None else []
        extras = [part for flag in self.profile.serving_extras if flag.value for part in (flag.flag, flag.value)]
        fault = ["--fault", self.fault] if self.fault else []
        return [
            *_glm53("mock", "vllm", self.profile.model_id),
            *("--profile", self.profile.name, "--host", LOCALHOST, "--port", str(self.ports.vllm)),
            *("--tensor-parallel-size", str(self.tensor_parallel_size), "--enable-prefix-caching"),
            *("--kv-transfer-config", json.dumps(transfer)),
            *text_only,
            *extras,
            *("--load-seconds", str(self.timing.load_seconds)),
            *fault,
        ]

    @property
    def exporter_url(self) -> str:
        return f"http://{LOCALHOST}:{self.ports.exporter}/metrics"

    def _log_facts_args(self) -> list[str]:
        """What the probe and the exporter both need to judge the logs: profile, TP size, chunk size, log files."""
        chunk = [] if self.lmcache_chunk_size is None else ["--chunk-size", str(self.lmcache_chunk_size)]
        return [
            *("--profile", self.profile.name, "--tensor-parallel-size", str(self.tensor_parallel_size)),
            *chunk,
            *(part for name in LOG_NAMES for part in ("--log", str(self.log(name)))),
        ]

    def probe_command(self) -> list[str]:
        return [*_glm53("probe", "startup"), *self._log_facts_args(), "--state-dir", str(self.workdir / ".probe")]

    def exporter_command(self) -> list[str]:
        return [
            *_glm53("exporter"),
            *self._log_facts_args(),
            *("--vllm-url", self.vllm_url, "--lmcache-url", f"http://{LOCALHOST}:{self.ports.lmcache_metrics}"),
            *("--host", LOCALHOST, "--port", str(self.ports.exporter)),
        ]


def _glm53(*args: str) -> list[str]:
    """This very toolkit, run by this interpreter (works from a venv without the console script on PATH)."""
    return [sys.executable, "-m", "glm53", *args]


class Supervised:
    """One server under `glm53 supervise`, alone in its own process group."""

    def __init__(self, name: str, log: Path, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as errors:  # supervise's own complaints (not the server's output) go to the log too
            self.process = subprocess.Popen(
                [*_glm53("supervise", "--log", str(log), "--"), *command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                env=env,
                start_new_session=True,
            )

    def check_running(self, exit_code: int) -> None:
        status = self.process.poll()
        if status is not None:
            raise Glm53Error(
                f"{self.name} exited with status {status} ({self.last_log_line()}); see {self.log}", exit_code
            )

    def last_log_line(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1].strip() if lines else "no output"

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM to the group, SIGKILL to whatever is left after the grace period (or at once if it already ended)."""
        pgid = self.process.pid  # the session leader's pid is the group id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(grace_seconds)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # stragglers: the server if the supervisor died first, or both
        self.process.wait()


@dataclass
class RunningPod:
    spec: PodSpec
    processes: list[Supervised] = field(default_factory=list)

    def check_running(self, exit_code: int = EXIT_NOT_READY) -> None:
        """Fail when a server has exited; before validation that means the pod never became Ready."""
        for process in self.processes:
            process.check_running(exit_code)

    def process(self, name: str) -> Supervised:
        return next(p for p in self.processes if p.name == name)


def prepare_workdir(workdir: Path) -> None:
    """Create the work dir and drop our files from an earlier run there: stale lines would mislead the probe."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        for name in (*LOG_NAMES, EXPORTER_LOG):
            for stale in (workdir / name, workdir / f"{name}.1"):
                stale.unlink(missing_ok=True)
        probe_state = workdir / ".probe"
        if probe_state.is_dir():
            for path in probe_state.iterdir():
                path.unlink()
    except OSError as error:
        raise Glm53Error(f"cannot prepare the work directory {workdir} ({error}); pass a writable --workdir") from None


@contextlib.contextmanager
def running_pod(spec: PodSpec, say: Callable[[str], None]) -> Iterator[RunningPod]:
    """Start LMCache, wait for its healthcheck, start vLLM; on leaving, stop both whatever happened."""
    prepare_workdir(spec.workdir)
    pod = RunningPod(spec)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        lmcache = Supervised("lmcache", spec.log("lmcache.log"), spec.lmcache_command(), env)
        pod.processes.append(lmcache)
        poll_until(lambda: _http_ok(spec.lmcache_health_url), spec.timing.http_deadline, pod, "LMCache /healthcheck")
        say(f"pod: LMCache {spec.generation} answering {spec.lmcache_health_url} (ZMQ on port {spec.ports.lmcache})")
        vllm_env = {**env, "VLLM_SERVER_DEV_MODE": "1"} if spec.dev_mode else env
        pod.processes.append(Supervised("vllm", spec.log("vllm.log"), spec.vllm_command(), vllm_env))
        pod.processes.append(Supervised("exporter", spec.log(EXPORTER_LOG), spec.exporter_command(), env))
        yield pod
    finally:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for process in reversed(pod.processes):  # vLLM first, then its sidecar, as Kubernetes stops a pod
                process.stop(spec.timing.grace_seconds)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def poll_until(ready: Callable[[], bool], deadline_seconds: float, pod: RunningPod, what: str) -> None:
    """Poll `ready` until it holds, failing early when a server exits and late when the deadline passes."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        pod.check_running()
        if ready():
            return
        if time.monotonic() > deadline:
            raise Glm53Error(
                f"{what} did not answer within {deadline_seconds:g}s; see the logs in {pod.spec.workdir}",
                EXIT_NOT_READY,
            )
        time.sleep(0.05)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return 200 <= int(response.status) < 300
    except (OSError, ValueError):
        return False


def wait_startup_probe(pod: RunningPod, say: Callable[[str], None]) -> str:
    """Run the startup probe like the kubelet: every period until Ready or the failure budget is spent.

    "Not yet" (3) spends budget; any other failure (4: geometry or chunk wrong, engine dead) cannot heal by waiting,
    so it ends the wait at once instead of burning the whole budget the way a kubelet would before restarting.
    """
    timing = pod.spec.timing
    line = "no output"
    for attempt in range(1, timing.probe_failure_threshold + 1):
        started = time.monotonic()
        result = subprocess.run(
            pod.spec.probe_command(), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
        # Probe first, then look for dead servers: a server that died of a wrong geometry or chunk size left the
        # reason in its log, and the probe's "wrong: ..." line names it better than an exit status does.
        output = (result.stdout + result.stderr).strip().splitlines()
        line = output[-1] if output else f"exit status {result.returncode}"
        if result.returncode == EXIT_READY:
            return line
        say(f"pod: startup probe {attempt}/{timing.probe_failure_threshold}: {line}")
        if result.returncode != EXIT_NOT_YET:
            raise Glm53Error(f"the startup probe failed: {line}; see the logs in {pod.spec.workdir}", EXIT_NOT_READY)
        pod.check_running()
        time.sleep(max(0.0, timing.probe_period - (time.monotonic() - started)))
    raise Glm53Error(
        f"the startup probe did not report Ready within {timing.probe_failure_threshold} attempts "
        f"({timing.probe_period:g}s apart); last: {line}",
        EXIT_NOT_READY,
    )


def wait_ready(pod: RunningPod) -> None:
    """The readiness probe: vLLM healthy and serving the model."""
    url = pod.spec.vllm_url

    def ready() -> bool:
        if not _http_ok(f"{url}/health"):
            return False
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2.0) as response:
                return bool(json.load(response).get("data"))
        except (OSError, ValueError, AttributeError):
            return False

    poll_until(ready, pod.spec.timing.http_deadline, pod, f"vLLM readiness ({url}/health, /v1/models)")


def say_to(stream: TextIO) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(message, file=stream, flush=True)

    return say


def exporter_highlights(exposition: str) -> list[str]:
    """The sample lines of the highlighted exporter series, in exposition order (comments and others dropped)."""
    return [line for line in exposition.splitlines() if line.startswith(EXPORTER_HIGHLIGHTS)]


def scrape_exporter(pod: RunningPod) -> list[str]:
    """What `curl` on the exporter shows an operator, trimmed to the highlights."""
    url = pod.spec.exporter_url
    poll_until(lambda: _http_ok(url), pod.spec.timing.http_deadline, pod, f"the exporter ({url})")
    try:
        with urllib.request.urlopen(url, timeout=10.0) as response:
            return exporter_highlights(response.read().decode("utf-8", errors="replace"))
    except OSError as error:
        raise Glm53Error(f"the exporter at {url} did not answer ({error}); see {pod.spec.log(EXPORTER_LOG)}") from None


@dataclass(frozen=True)
class PodOutcome:
    report: ValidationReport
    exporter_lines: list[str]
    seconds: float  # start to all processes stopped


def run_pod(spec: PodSpec, say: Callable[[str], None], progress: Progress) -> PodOutcome:
    """Start the pod, wait for the startup and readiness probes, validate it, stop it; the report says pass or fail."""
    start = time.perf_counter()
    with running_pod(spec, say) as pod:
        probe_line = wait_startup_probe(pod, say)
        say(f"pod: startup probe Ready: {probe_line}")
        wait_ready(pod)
        say(f"pod: vLLM ready at {spec.vllm_url}; validating (equivalence, boundary, perf)")
        config = ValidationConfig(spec.vllm_url, spec.profile, chunk_size=spec.profile.recommended_chunk_size)
        try:
            report = run_validation(config, progress)
        except Glm53Error as error:
            pod.check_running(EXIT_FAILURE)  # a dead server explains the failure better than the request that noticed
            raise Glm53Error(f"validation could not complete: {error.message}", EXIT_FAILURE) from None
        for process in pod.processes:
            if process.process.poll() is not None:  # e.g. LMCache died: vLLM degrades to misses, validation fails
                status = process.process.returncode
                say(f"pod: {process.name} exited with status {status} during validation; see {process.log}")
        exporter_lines = scrape_exporter(pod)
    return PodOutcome(report, exporter_lines, time.perf_counter() - start)
