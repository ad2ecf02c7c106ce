"""Run a pod plan as processes on 127.0.0.1, as a kubelet runs a pod: the runner of `glm53 pod` and `glm53 fleet`.

A pod has its own network namespace, volumes and PID 1; processes on one machine share all three. So before anything
runs, `relocate` gives the plan this machine's places, in this one function, and returns a printable account of them:
- every port the pod listens on (declared container ports, `--*port` flag values, ZMQ binds `tcp://*:P`) moves to a
  free loopback port, wherever the plan names it (flag values, `host:port` in URLs and JSON), so pods never collide;
  a port the rules cannot find in some string is an error, not a silent clash;
- a wildcard bind (`0.0.0.0`, which a pod needs behind its Service) becomes 127.0.0.1: nothing here listens beyond
  loopback;
- every emptyDir becomes a directory under the work dir (emptied first, as a new pod's are), except the in-memory one
  mounted at /dev/shm, which is the host's memory-backed /dev/shm (the servers name their segments per process);
- a Secret volume becomes a directory holding a fresh random value for each projected key, readable by this user only:
  the runner plays the operator who created the Secret (`kubectl create secret ... "$(openssl rand -hex 24)"`); a
  variable from a Secret's key gets the value the caller created the Secret with (the shared L2 tier's Redis
  password, which the caller's Redis also has), else a fresh random one;
- a mount path inside a JSON object argument (LMCache's `--l2-adapter` names its directory there) moves too;
- the images' environment, /opt/glm53 (a venv), is this interpreter's: a path under it (the mock image's LMCache
  generation overlay on PYTHONPATH) names the same place under `sys.prefix`;
- the image's init (`tini --`) is left out: each container runs in its own process group, which this runner signals.

Then `running_pod` starts the containers in the kubelet's order: each plain init container, run to completion (a
failure stops the pod: the kubelet would retry it); each native sidecar, and only after its startup probe passed, the
next; then the main containers together. Exec probes run with the container's environment and honour the
rendered period, timeout and failure threshold. A container's stdout and stderr go to `containers/<name>.log` (what
`kubectl logs` shows). Leaving stops the main containers, then the sidecars (SIGTERM to the group, SIGKILL after the
pod's grace period), with SIGINT/SIGTERM ignored meanwhile, so an interrupt leaves no process behind; then it removes
the KV segments a stopped engine left in /dev/shm (a pod's /dev/shm goes with the pod; the host's stays).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.pod.plan import ContainerPlan, ExecProbe, HttpGetProbe, PodPlan

LOCALHOST = "127.0.0.1"
WILDCARD = "0.0.0.0"
SHM = "/dev/shm"
# The images' Python environment (docker/mock: `python3 -m venv /opt/glm53`); here, this interpreter's.
IMAGE_VENV = "/opt/glm53"
EXIT_NOT_READY = 3  # the pod never became Ready: a container died or a startup probe gave up (kubelet: restart)
# An exec probe that ran past its timeoutSeconds: one failure, tried again at the next period, never a verdict
# (kubernetes/enhancements keps/sig-node/1972-kubelet-exec-probe-timeouts: the kubelet enforces the timeout since 1.20
# and counts it as a failed probe). A loaded node (two cores building LMCache beside the pod) makes a probe slow.
PROBE_TIMED_OUT = -2
_PORT_FLAG = re.compile(r"^--[a-z0-9-]*port$")
_ZMQ_BIND = re.compile(r"tcp://\*:(\d+)")
_INIT_NAMES = ("tini", "tini-static", "dumb-init")
# lmcache 0.5.6 lmcache/v1/platform/devices/cpu/shm.py:82,377-381: on CPU the connector moves each KV cache into a
# POSIX segment `/lmcache_kv_<pid>_<n>` of the engine's worker and does not unlink it when the engine stops.
_LMCACHE_KV_SEGMENT = re.compile(r"^lmcache_kv_(\d+)_\d+$")


# The kernel's ephemeral range, where bind(port 0) and every outgoing connection's source port come from.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on loopback now, each checked by binding it (the sockets are held open together).

    They lie below the kernel's ephemeral range: a port that bind(0) gave out and this runner released is free to
    become the source port of any outgoing connection on the machine before the server it was meant for binds it (a CI
    run on a loaded machine saw LMCache's ZMQ bind fail with "Address already in use"). Below that range only another
    runner's pick can take it, and a random order keeps two runners apart. Where the range leaves no room below it,
    the kernel picks, as bind(0) does."""
    first_ephemeral = ephemeral_range_start()
    candidates = list(range(LOWEST_PORT, first_ephemeral))
    random.shuffle(candidates)
    chosen: list[int] = []
    with contextlib.ExitStack() as stack:
        for port in candidates:
            if len(chosen) == count:
                break
            sock = stack.enter_context(socket.socket())
            with contextlib.suppress(OSError):
                sock.bind((LOCALHOST, port))
                chosen.append(port)
        for _ in range(count - len(chosen)):
            sock = stack.enter_context(socket.socket())
            sock.bind((LOCALHOST, 0))
            chosen.append(sock.getsockname()[1])
    return chosen


def ephemeral_range_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where the file cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@dataclass(frozen=True)
class Relocation:
    """Where the pod's places are on this machine: pod port -> loopback port, volume name -> directory."""

    ports: Mapping[int, int]
    volumes: Mapping[str, Path]
    # Secret volumes: their file names, each written with a fresh random value.
    secrets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The values of the Secrets' keys that containers read as variables: (Secret, key) -> value.
    secret_values: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # Volumes whose directory other pods use too (a fleet's weights, as replicas mount one claim): kept, not emptied.
    shared: frozenset[str] = frozenset()

    def port(self, pod_port: int) -> int:
        return self.ports.get(pod_port, pod_port)

    def describe(self) -> list[str]:
        """The rewrites, for the runner to print."""
        ports = ", ".join(f"{before}->{after}" for before, after in sorted(self.ports.items()))
        shared = {name: " (shared)" for name in self.shared}
        volumes = ", ".join(f"{name} -> {path}{shared.get(name, '')}" for name, path in sorted(self.volumes.items()))
        lines = [
            f"ports moved to free loopback ones: {ports or 'none'}; wildcard binds {WILDCARD} -> {LOCALHOST}",
            f"volumes: {volumes or 'none'}; the image's init (tini) is left to this runner's process groups",
            f"the images' {IMAGE_VENV} -> {sys.prefix}",
        ]
        lines += [
            f"secret volume {name}: a fresh random {', '.join(keys)}" for name, keys in sorted(self.secrets.items())
        ]
        lines += [f"secret {name}, key {key}: given to the variables that read it" for name, key in self.secret_values]
        return lines


def listening_ports(plan: PodPlan) -> list[int]:
    """Every port the plan's containers listen on, in ascending order."""
    ports: set[int] = set()
    for container in plan.containers:
        ports.update(p.port for p in container.ports)
        for flag, value in zip(container.argv, container.argv[1:], strict=False):
            if _PORT_FLAG.match(flag) and value.isdigit():
                ports.add(int(value))
        for part in container.argv:
            ports.update(int(port) for port in _ZMQ_BIND.findall(part))
    return sorted(ports)


def relocation_for(
    plan: PodPlan,
    workdir: Path,
    secret_values: Mapping[tuple[str, str], str] | None = None,
    shared_volumes: Mapping[str, Path] | None = None,
) -> Relocation:
    """Free loopback ports for the plan's ports, a directory per emptyDir under `workdir` (/dev/shm stays) or, for a
    volume named in `shared_volumes`, the directory given there, and a value for each Secret key a container reads as a
    variable: from `secret_values` (the Secrets the operator created, as (name, key) -> value), else a fresh random
    one, as for Secret volumes."""
    shared = dict(shared_volumes or {})
    pod_ports = listening_ports(plan)
    volumes: dict[str, Path] = {}
    secret_files: dict[str, tuple[str, ...]] = {}
    for volume in plan.volumes:
        if volume.secret_name is not None and volume.secret_paths:
            volumes[volume.name] = workdir / volume.name
            secret_files[volume.name] = volume.secret_paths
            continue
        if not volume.empty_dir:
            raise Glm53Error(
                f"volume {volume.name!r} of pod {plan.name!r} is not an emptyDir or a Secret's listed keys; the "
                "loopback runner provides those only (render mock mode with weights.source=none)",
                EXIT_FAILURE,
            )
        at_shm = any(m.volume == volume.name and m.path == SHM for c in plan.containers for m in c.mounts)
        if volume.name in shared:
            volumes[volume.name] = shared[volume.name]
        else:
            volumes[volume.name] = Path(SHM) if volume.in_memory and at_shm else workdir / volume.name
    given = secret_values or {}
    values = {
        (name, key): given.get((name, key)) or secrets.token_hex(24)
        for container in plan.containers
        for _, name, key in container.secret_env
    }
    unknown = sorted(set(shared) - set(volumes))
    if unknown:
        raise Glm53Error(f"pod {plan.name!r} has no emptyDir volume {unknown[0]!r} to share", EXIT_FAILURE)
    ports = dict(zip(pod_ports, free_ports(len(pod_ports)), strict=True))
    return Relocation(ports, volumes, secret_files, values, frozenset(shared))


def _move_ports(text: str, ports: Mapping[int, int], where: str) -> str:
    """`text` with every pod port moved: a whole value, or after a colon; any other mention of one is an error."""
    if not ports:
        return text
    alternatives = "|".join(str(port) for port in sorted(ports, reverse=True))
    for match in re.finditer(rf"(?<![0-9])({alternatives})(?![0-9])", text):
        if match.group() != text and text[match.start() - 1 : match.start()] != ":":
            raise Glm53Error(
                f"port {match.group()} appears in {where} as {text!r}, where the loopback runner cannot move it; "
                "name ports as flag values or host:port in the chart's helpers",
                EXIT_FAILURE,
            )
    if text.isdigit() and int(text) in ports:
        return str(ports[int(text)])
    return re.sub(rf"(?<=:)({alternatives})(?![0-9])", lambda m: str(ports[int(m.group())]), text)


def _move_paths(text: str, mounts: Mapping[str, Path]) -> str:
    """`text` with a leading mount path moved; in a JSON object argument (LMCache's `--l2-adapter`), each string
    value's."""
    if text.startswith("{"):
        with contextlib.suppress(ValueError):
            return json.dumps(_move_json_paths(json.loads(text), mounts), separators=(",", ":"))
    for mount_path, directory in {**mounts, IMAGE_VENV: Path(sys.prefix)}.items():
        if text == mount_path or text.startswith(mount_path.rstrip("/") + "/"):
            return str(directory) + text[len(mount_path) :]
    return text


def _move_json_paths(value: Any, mounts: Mapping[str, Path]) -> Any:
    if isinstance(value, str):
        return _move_paths(value, mounts)
    if isinstance(value, dict):
        return {key: _move_json_paths(item, mounts) for key, item in value.items()}
    if isinstance(value, list):
        return [_move_json_paths(item, mounts) for item in value]
    return value


def _relocate_string(text: str, relocation: Relocation, mounts: Mapping[str, Path], where: str) -> str:
    moved = _move_paths(_move_ports(text, relocation.ports, where), mounts)
    return LOCALHOST if moved == WILDCARD else moved


def _without_init(argv: tuple[str, ...]) -> tuple[str, ...]:
    if len(argv) > 1 and Path(argv[0]).name in _INIT_NAMES and argv[1] == "--":
        return argv[2:]
    return argv


def _relocate_container(container: ContainerPlan, relocation: Relocation) -> ContainerPlan:
    # Longest mount path first, so /var/log/glm53/x never matches a shorter prefix's mount.
    mounts = {
        m.path: relocation.volumes[m.volume] for m in sorted(container.mounts, key=lambda m: len(m.path), reverse=True)
    }

    def strings(parts: tuple[str, ...], what: str) -> tuple[str, ...]:
        where = f"the {what} of container {container.name!r}"
        return tuple(_relocate_string(part, relocation, mounts, where) for part in parts)

    def probe(spec: ExecProbe | None, what: str) -> ExecProbe | None:
        return None if spec is None else dataclasses.replace(spec, command=strings(spec.command, what))

    liveness = container.liveness_probe
    if isinstance(liveness, HttpGetProbe):
        liveness = dataclasses.replace(liveness, port=relocation.port(liveness.port))
    else:
        liveness = probe(liveness, "liveness probe")

    env = tuple(
        (name, _relocate_string(value, relocation, mounts, f"env {name} of container {container.name!r}"))
        for name, value in container.env
    ) + tuple((name, relocation.secret_values[(secret, key)]) for name, secret, key in container.secret_env)
    return dataclasses.replace(
        container,
        argv=strings(_without_init(container.argv), "command"),
        env=env,
        secret_env=(),
        ports=tuple(dataclasses.replace(p, port=relocation.port(p.port)) for p in container.ports),
        startup_probe=probe(container.startup_probe, "startup probe"),
        readiness_probe=probe(container.readiness_probe, "readiness probe"),
        liveness_probe=liveness,
    )


def relocate(plan: PodPlan, relocation: Relocation) -> PodPlan:
    """The plan with this machine's ports, bind address and directories: the loopback runner's only rewrite."""
    return dataclasses.replace(plan, containers=tuple(_relocate_container(c, relocation) for c in plan.containers))


def service_url_on_loopback(url: str, target_port: int) -> str:
    """A Service URL (`http://<service>:<port>/...`) as reached here: loopback, the target port."""
    return urlunsplit(urlsplit(url)._replace(netloc=f"{LOCALHOST}:{target_port}"))


def container_env(container: ContainerPlan) -> dict[str, str]:
    """This process's environment, the container's variables over it, and this interpreter's bin dir first on PATH.

    The chart names programs as the images have them on PATH (`glm53`, `lmcache`, `python3`); on this machine they
    are the console scripts of the environment running the toolkit.
    """
    env = {**os.environ, **dict(container.env)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


class ContainerProcess:
    """One container's command (or the fleet's router), alone in its own process group, its output in `log`."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self.env = dict(env)
        program = shutil.which(argv[0], path=self.env.get("PATH"))
        if program is None:
            raise Glm53Error(
                f"{name} runs {argv[0]!r}, which is not installed here; install the toolkit with its extras: "
                "pip install -e '.[pod,chart]' (or run `bash scripts/bootstrap.sh dev`)",
                EXIT_FAILURE,
            )
        with open(log, "ab") as output:
            self.process = subprocess.Popen(
                [program, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=self.env,
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

    def exec_probe(self, probe: ExecProbe) -> tuple[int, str]:
        """Run `probe` as the kubelet would, in the container's environment: its exit code and last output line."""
        try:
            result = subprocess.run(
                list(probe.command),
                capture_output=True,
                text=True,
                timeout=probe.timeout_s,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        except subprocess.TimeoutExpired:
            return PROBE_TIMED_OUT, f"probe timed out after {probe.timeout_s:g} s"
        except OSError as error:
            return -1, f"probe could not run: {error}"
        output = (result.stdout + result.stderr).strip().splitlines()
        return result.returncode, output[-1] if output else f"exit status {result.returncode}"

    @staticmethod
    def http_probe(probe: HttpGetProbe) -> tuple[int, str]:
        """GET the probe's path on loopback as the kubelet would: 0 on a 2xx or 3xx answer, else 1 and why."""
        url = f"http://{LOCALHOST}:{probe.port}{probe.path}"
        try:
            with urllib.request.urlopen(url, timeout=probe.timeout_s) as response:
                return 0, f"{url}: HTTP {response.status}"
        except urllib.error.HTTPError as error:
            return (0 if error.code < 400 else 1), f"{url}: HTTP {error.code}"
        except OSError as error:
            return 1, f"{url}: {error}"

    def probe(self, probe: ExecProbe | HttpGetProbe) -> tuple[int, str]:
        """Run either kind of probe: its exit code (0 passes) and one line."""
        return self.http_probe(probe) if isinstance(probe, HttpGetProbe) else self.exec_probe(probe)

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
        wait_group_gone(pgid, GROUP_GONE_S)


# How long the members of a SIGKILLed group may take to die and be reaped (orphans by then, which init reaps).
GROUP_GONE_S = 10.0


def wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Until no process of group `pgid` exists, or `timeout_s` passed. SIGKILL is delivered asynchronously, and a
    member that outlives the leader (the engine's worker, still printing its shutdown warnings) exists, so still owns
    its files, for a moment after killpg returns: remove_stale_kv_segments, run next, leaves a living process's KV
    segment alone (a CI run found the real engine's worker segment left behind so)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@dataclass
class RunningPod:
    """A relocated plan whose containers run; `startup_seconds` says when each sidecar passed its startup probe."""

    plan: PodPlan
    relocation: Relocation
    workdir: Path
    processes: list[ContainerProcess] = field(default_factory=list)
    startup_seconds: dict[str, float] = field(default_factory=dict)
    # Guards `processes` once the kubelet's restarts (glm53.pod.kubelet) replace entries from their own threads.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def process(self, name: str) -> ContainerProcess:
        with self.lock:
            for process in self.processes:
                if process.name == name:
                    return process
        raise Glm53Error(f"container {name!r} of pod {self.plan.name!r} is not running", EXIT_FAILURE)

    def start(self, container: ContainerPlan) -> ContainerProcess:
        """Start (or start again, replacing the exited process) one of the plan's containers; its log is appended to."""
        log = self.workdir / "containers" / f"{container.name}.log"
        process = ContainerProcess(container.name, container.argv, container_env(container), log)
        with self.lock:
            names = [p.name for p in self.processes]
            if container.name in names:  # a restart keeps the container's place in the stop order
                self.processes[names.index(container.name)] = process
            else:
                self.processes.append(process)
        return process

    def check_running(self, exit_code: int = EXIT_NOT_READY) -> None:
        """Fail when a container has exited; before the pod is Ready that means it never became Ready."""
        with self.lock:
            processes = list(self.processes)
        for process in processes:
            process.check_running(exit_code)


def wait_probe(
    pod: RunningPod,
    name: str,
    probe: ExecProbe,
    say: Callable[[str], None],
    label: str,
    gives_up: Callable[[int], bool] = lambda _code: False,
    within_s: float | None = None,
) -> str:
    """Run `probe` every period until it passes, as the kubelet does; its passing output line.

    Fails when the failure threshold is spent (or `within_s`, for a readiness probe, which the kubelet never stops
    running), when `gives_up(exit code)` says a failure is final (the startup probe's "wrong" verdict), or when a
    container exited. A probe that timed out gave no verdict, so it only spends an attempt, as on a kubelet. The probe
    runs before the liveness check: a server that died of a wrong geometry left the reason in its log, and the probe's
    line names it better than an exit status does.
    """
    process = pod.process(name)
    attempts = probe.failure_threshold if within_s is None else max(1, math.ceil(within_s / probe.period_s))
    line = "no output"
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        code, line = process.exec_probe(probe)
        if code == 0:
            return line
        say(f"pod: {label} {attempt}/{attempts}: {line}")
        if code != PROBE_TIMED_OUT and gives_up(code):
            raise Glm53Error(f"the {label} of {name} failed: {line}; see the logs in {pod.workdir}", EXIT_NOT_READY)
        pod.check_running()
        time.sleep(max(0.0, probe.period_s - (time.monotonic() - started)))
    raise Glm53Error(
        f"the {label} of {name} did not pass within {attempts} attempts ({probe.period_s:g} s apart); last: {line}; "
        f"see the logs in {pod.workdir}",
        EXIT_NOT_READY,
    )


def quiet(_line: str) -> None:
    """A `say` that says nothing."""


def prepare_volumes(relocation: Relocation, workdir: Path) -> None:
    """Fresh, empty emptyDir directories (stale logs or probe state from an earlier run would mislead the probe; a
    shared one is only made sure to exist: its other pods may be using it), and each Secret volume's files with a fresh
    random value, readable by this user only (the chart's 0440 less the group a runner here has no use for)."""
    try:
        (workdir / "containers").mkdir(parents=True, exist_ok=True)
        for name, directory in relocation.volumes.items():
            if name in relocation.shared:
                directory.mkdir(parents=True, exist_ok=True)
            elif directory != Path(SHM):
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir(parents=True)
        for name, paths in relocation.secrets.items():
            for path in paths:
                secret = relocation.volumes[name] / path
                secret.parent.mkdir(parents=True, exist_ok=True)
                secret.write_text(secrets.token_hex(24) + "\n")
                secret.chmod(0o400)
    except OSError as error:
        raise Glm53Error(f"cannot prepare the work directory {workdir} ({error}); pass a writable --workdir") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_kv_segments(shm: Path, since: float) -> list[str]:
    """Unlink LMCache's KV segments in `shm` created since `since` (epoch s) whose process is gone; their names.

    Only segments of dead processes are touched, so the pods of a fleet, still running, keep theirs.
    """
    removed = []
    for path in sorted(shm.glob("lmcache_kv_*")):
        match = _LMCACHE_KV_SEGMENT.match(path.name)
        with contextlib.suppress(FileNotFoundError):
            if match and not _alive(int(match.group(1))) and path.stat().st_mtime >= since:
                path.unlink()
                removed.append(path.name)
    return removed


def run_to_completion(container: ContainerPlan, log: Path, grace_seconds: float) -> None:
    """A plain init container: its command must exit 0 before the next container starts, as the kubelet requires."""
    process = ContainerProcess(container.name, container.argv, container_env(container), log)
    try:
        status = process.process.wait()
    finally:
        stop_all([process], grace_seconds)  # at once if it ended; an interrupt meanwhile must not orphan it
    if status != 0:
        raise Glm53Error(
            f"init container {container.name} exited with status {status} ({process.last_log_line()}); see {log}",
            EXIT_NOT_READY,
        )


def stop_all(processes: Sequence[ContainerProcess], grace_seconds: float) -> None:
    """Stop `processes` in order, deaf to Ctrl-C and SIGTERM meanwhile, so an impatient second signal orphans none."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for process in processes:
            process.stop(grace_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def running_pod(
    plan: PodPlan,
    workdir: Path,
    say: Callable[[str], None],
    relocation: Relocation | None = None,
    secret_values: Mapping[tuple[str, str], str] | None = None,
) -> Iterator[RunningPod]:
    """Relocate `plan` (with `secret_values` for its Secret variables, see `relocation_for`), start its containers in
    the kubelet's order, and stop them all on leaving, whatever happened."""
    relocation = relocation or relocation_for(plan, workdir, secret_values)
    pod = RunningPod(relocate(plan, relocation), relocation, workdir)
    prepare_volumes(relocation, workdir)
    for line in relocation.describe():
        say(f"{plan.name}: loopback: {line}")
    pod_started = time.time() - 1.0  # mtime granularity: a segment made in the first instant still counts
    try:
        for container in pod.plan.containers:
            started = time.monotonic()
            log = workdir / "containers" / f"{container.name}.log"
            if container.init:
                run_to_completion(container, log, plan.grace_period_s)
                continue
            pod.start(container)
            if container.sidecar and container.startup_probe is not None:
                wait_probe(pod, container.name, container.startup_probe, quiet, "startup probe")
                pod.startup_seconds[container.name] = time.monotonic() - started
        yield pod
    finally:
        # Main containers first, then the sidecars in reverse start order, as Kubernetes stops a pod.
        sidecars = {c.name for c in plan.containers if c.sidecar}
        order = [p for p in reversed(pod.processes) if p.name not in sidecars]
        order += [p for p in reversed(pod.processes) if p.name in sidecars]
        stop_all(order, plan.grace_period_s)
        removed = remove_stale_kv_segments(Path(SHM), pod_started)
        if removed:
            say(f"{plan.name}: removed {len(removed)} KV segment(s) the engine left in {SHM}: {', '.join(removed)}")
