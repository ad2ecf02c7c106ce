"""The CPU pod on this machine: the README's main job, run the way Kubernetes would run the real pod.

Order and checks mirror the chart. The real `lmcache server` (LMCache 0.5.6, the `pod` extra) starts first under
`glm53 supervise` with the chart's sidecar flags (`glm53.sidecar`) and must answer `/healthcheck` (the native
sidecar's startup probe) before the engine stand-in (`glm53 mock vllm`, which moves KV data with LMCache's own client)
starts; `glm53 probe startup` is then run
every second against both log files, like the kubelet's startup probe with a failure budget, until it reports Ready;
then the readiness check (`/health`, `/v1/models`); then `glm53 validate`'s three checks; then the exporter container's
`/metrics` and the server's own `/metrics` (on its HTTP port: `lmcache server` opens no separate metrics listener)
are read, as an operator would `curl` them, to show the geometry facts, hit ratios and the server's `lmcache_mp_*`
counters; then everything stops.

Every server runs in its own process group (a new session), so stopping is one signal per group — SIGTERM, then
SIGKILL after a grace period — and reaches the supervisor and the server it runs alike. Stopping happens in a
`finally` with SIGINT/SIGTERM ignored, so an interrupt, a failure or a passing run all leave no process behind.
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
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.probe import EXIT_NOT_YET, EXIT_READY
from glm53.profiles import ModelProfile
from glm53.sidecar import lmcache_server_command
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
# The real server's own counters the main job shows (lmcache 0.5.6 lmcache_mp_* names, served on its HTTP port).
LMCACHE_HIGHLIGHTS = (
    "lmcache_mp_lookup_requested_tokens_total",
    "lmcache_mp_lookup_hit_tokens_total",
    "lmcache_mp_num_finished_stores_total",
    "lmcache_mp_num_finished_retrieves_total",
)
# L1 size of the CPU pod's server: its pool lives in /dev/shm (`--shm-name`), so it costs no RSS until used.
CPU_L1_SIZE_GB = 1.0


@dataclass(frozen=True)
class Timing:
    """How patient the pod is. The defaults keep the whole main job well under a minute on two cores."""

    # Simulated model load of the engine stand-in: long enough that the probe sees "not yet" before "Ready".
    load_seconds: float = 2.0
    # How long the real LMCache server may take to answer /healthcheck (3-7 s measured; slower on a busy machine).
    lmcache_deadline: float = 60.0
    # The kubelet's startupProbe: periodSeconds and failureThreshold.
    probe_period: float = 1.0
    probe_failure_threshold: int = 30
    # How long LMCache's /healthcheck and vLLM's readiness may take once their process is up.
    http_deadline: float = 20.0
    # terminationGracePeriodSeconds: SIGTERM, then SIGKILL after this long (the real server needs ~5 s to stop).
    grace_seconds: float = 15.0


@dataclass(frozen=True)
class PodPorts:
    """The pod's loopback ports (8000, 5555, 8080, 9400 in Kubernetes; free ones here, so runs never collide)."""

    vllm: int
    lmcache: int
    lmcache_http: int
    exporter: int

    @classmethod
    def free(cls) -> PodPorts:
        return cls(*free_ports(4))


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
    fault: str | None = None
    timing: Timing = field(default_factory=Timing)
    # A chunk size other than the profile's (the wrong-chunk-size path: the engine must refuse it at start-up).
    chunk_size_override: int | None = None
    # Validation needs vLLM's dev-mode endpoints; False starts vLLM as production would (no /reset_prefix_cache).
    dev_mode: bool = True

    @property
    def tensor_parallel_size(self) -> int:
        return self.profile.tensor_parallel_size

    @property
    def lmcache_chunk_size(self) -> int:
        """The --chunk-size given to LMCache: always explicit, since the released 0.5.6 cannot negotiate it."""
        return self.chunk_size_override or self.profile.recommended_chunk_size

    @property
    def vllm_url(self) -> str:
        return f"http://{LOCALHOST}:{self.ports.vllm}"

    def log(self, name: str) -> Path:
        return self.workdir / name

    @property
    def lmcache_url(self) -> str:
        """The server's HTTP front: /healthcheck and /metrics."""
        return f"http://{LOCALHOST}:{self.ports.lmcache_http}"

    @property
    def lmcache_shm_name(self) -> str:
        """The L1 pool's /dev/shm segment: unique per pod, since two servers must never share one."""
        return f"glm53-pod-{os.getpid()}-{self.ports.lmcache}"

    def lmcache_command(self) -> tuple[list[str], dict[str, str]]:
        """The real `lmcache server` from this interpreter's environment, with the chart's flags; argv and env."""
        command = lmcache_server_command(
            (lmcache_program(), "server"),
            port=self.ports.lmcache,
            http_port=self.ports.lmcache_http,
            chunk_size=self.lmcache_chunk_size,
            separate_object_groups=self.profile.separate_object_groups_required,
            l1_size_gb=CPU_L1_SIZE_GB,
            shm_name=self.lmcache_shm_name,
        )
        return list(command.argv), command.env

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
            "--enable-prompt-tokens-details",  # validation reads usage.prompt_tokens_details.cached_tokens
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
        return [
            *("--profile", self.profile.name, "--tensor-parallel-size", str(self.tensor_parallel_size)),
            *("--chunk-size", str(self.lmcache_chunk_size)),
            *(part for name in LOG_NAMES for part in ("--log", str(self.log(name)))),
        ]

    def probe_command(self) -> list[str]:
        return [*_glm53("probe", "startup"), *self._log_facts_args(), "--state-dir", str(self.workdir / ".probe")]

    def exporter_command(self) -> list[str]:
        return [
            *_glm53("exporter"),
            *self._log_facts_args(),
            *("--vllm-url", self.vllm_url, "--lmcache-url", self.lmcache_url),
            *("--host", LOCALHOST, "--port", str(self.ports.exporter)),
        ]


def _glm53(*args: str) -> list[str]:
    """This very toolkit, run by this interpreter (works from a venv without the console script on PATH)."""
    return [sys.executable, "-m", "glm53", *args]


def lmcache_program() -> str:
    """The `lmcache` console script of this interpreter's environment (the `pod` extra), else the one on PATH."""
    beside = Path(sys.executable).with_name("lmcache")
    found = str(beside) if beside.is_file() else shutil.which("lmcache")
    if found is None:
        raise Glm53Error(
            "the CPU pod runs the real LMCache server, but `lmcache` is not installed; install the pod extra: "
            "pip install -e '.[pod]' (or run `bash scripts/bootstrap.sh dev`)"
        )
    return found


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
    lmcache_startup_seconds: float = 0.0

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
    """Start the LMCache server, wait for its healthcheck, start the engine; on leaving, stop all whatever happened."""
    prepare_workdir(spec.workdir)
    pod = RunningPod(spec)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        argv, sidecar_env = spec.lmcache_command()
        started = time.monotonic()
        lmcache = Supervised("lmcache", spec.log("lmcache.log"), argv, {**env, **sidecar_env})
        pod.processes.append(lmcache)
        health = f"{spec.lmcache_url}/healthcheck"
        poll_until(lambda: _http_ok(health), spec.timing.lmcache_deadline, pod, "the LMCache server's /healthcheck")
        pod.lmcache_startup_seconds = time.monotonic() - started
        say(
            f"pod: LMCache 0.5.6 server healthy after {pod.lmcache_startup_seconds:.1f} s at {health} "
            f"(ZMQ on port {spec.ports.lmcache}, chunk size {spec.lmcache_chunk_size})"
        )
        # vLLM's telemetry opt-outs, as the chart sets them; dev mode for /reset_prefix_cache (validation needs it).
        vllm_env = {**env, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if spec.dev_mode:
            vllm_env["VLLM_SERVER_DEV_MODE"] = "1"
        pod.processes.append(Supervised("vllm", spec.log("vllm.log"), spec.vllm_command(), vllm_env))
        pod.processes.append(Supervised("exporter", spec.log(EXPORTER_LOG), spec.exporter_command(), env))
        yield pod
    finally:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for process in reversed(pod.processes):  # the engine first, then its sidecar, as Kubernetes stops a pod
                process.stop(spec.timing.grace_seconds)
            # A server that had to be killed leaves its pool behind (lmcache 0.5.6 v1/multiprocess/engine_context.py:
            # 343-344 names it lmcache_l1_pool_<--shm-name>); a pod's memory-backed /dev/shm dies with the pod.
            Path("/dev/shm", f"lmcache_l1_pool_{spec.lmcache_shm_name}").unlink(missing_ok=True)
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


def highlights(exposition: str, names: tuple[str, ...]) -> list[str]:
    """The sample lines of the named series, in exposition order (comments, `_created` and others dropped)."""
    return [line for line in exposition.splitlines() if line.startswith(names) and "_created" not in line]


def exporter_highlights(exposition: str) -> list[str]:
    return highlights(exposition, EXPORTER_HIGHLIGHTS)


def totals(exposition: str, names: tuple[str, ...]) -> list[str]:
    """One line per named series: its samples summed over every label set (the server labels each cache_salt)."""
    sums: dict[str, tuple[float, int]] = {}
    for line in highlights(exposition, names):
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            total, count = sums.get(name, (0.0, 0))
            sums[name] = (total + float(line.rsplit(" ", 1)[1]), count + 1)
    return [f"{name} {sums[name][0]:g} (sum of {sums[name][1]} series)" for name in names if name in sums]


def scrape(pod: RunningPod, url: str, log: Path) -> str:
    """What `curl` on a metrics endpoint shows an operator."""
    poll_until(lambda: _http_ok(url), pod.spec.timing.http_deadline, pod, url)
    try:
        with urllib.request.urlopen(url, timeout=10.0) as response:
            return str(response.read().decode("utf-8", errors="replace"))
    except OSError as error:
        raise Glm53Error(f"{url} did not answer ({error}); see {log}") from None


@dataclass(frozen=True)
class PodOutcome:
    report: ValidationReport
    exporter_lines: list[str]
    lmcache_lines: list[str]  # the real server's lmcache_mp_* counters after validation, summed over cache salts
    lmcache_startup_seconds: float  # spawn to /healthcheck answering
    seconds: float  # start to all processes stopped


def run_pod(spec: PodSpec, say: Callable[[str], None], progress: Progress) -> PodOutcome:
    """Start the pod, wait for the startup and readiness probes, validate it, stop it; the report says pass or fail."""
    start = time.perf_counter()
    with running_pod(spec, say) as pod:
        probe_line = wait_startup_probe(pod, say)
        say(f"pod: startup probe Ready: {probe_line}")
        wait_ready(pod)
        say(f"pod: vLLM ready at {spec.vllm_url}; validating (equivalence, boundary, perf)")
        config = ValidationConfig(spec.vllm_url, spec.profile, chunk_size=spec.lmcache_chunk_size)
        try:
            report = run_validation(config, progress)
        except Glm53Error as error:
            pod.check_running(EXIT_FAILURE)  # a dead server explains the failure better than the request that noticed
            raise Glm53Error(f"validation could not complete: {error.message}", EXIT_FAILURE) from None
        pod.check_running(EXIT_FAILURE)
        exporter_lines = exporter_highlights(scrape(pod, spec.exporter_url, spec.log(EXPORTER_LOG)))
        lmcache_metrics = scrape(pod, f"{spec.lmcache_url}/metrics", spec.log("lmcache.log"))
        lmcache_lines = totals(lmcache_metrics, LMCACHE_HIGHLIGHTS)
        startup = pod.lmcache_startup_seconds
    return PodOutcome(report, exporter_lines, lmcache_lines, startup, time.perf_counter() - start)
