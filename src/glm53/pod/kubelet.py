"""After Ready, what the kubelet keeps doing for a loopback pod: restart containers that exit, and run liveness probes.

Why: the pod's promise does not end at Ready. What a sidecar fault does to the engine depends on how soon, and how
often, the kubelet starts the sidecar again, so a runner that only starts a pod proves nothing about its life. Here,
per container (one thread each, so a slow probe of one never delays another):
- a container that exits is started again when its policy says so (a native sidecar always; a main container per the
  pod's `restartPolicy`): at once the first time, then after the kubelet's back-off, 10 s doubling up to 300 s
  (kubernetes pkg/kubelet/kubelet.go: `backOffPeriod = 10 * time.Second`, `MaxContainerBackOff = 300 * time.Second`),
  forgotten again once the container ran for twice the maximum;
- a started-again container runs its startup probe again (a spent budget kills and restarts it), and its liveness
  probe only after that passed;
- a liveness probe that fails `failureThreshold` times in a row kills the container (SIGTERM, SIGKILL after the pod's
  grace period), which then restarts as above.
Every restart is an event (when, which container, why), kept for the fault suite's table and printed as it happens.
The loop usually takes over a Ready pod; containers named `starting` are still starting when it does (the engine of a
pod whose sidecar is gone at engine start): their startup probe runs first, and their liveness probe only after it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from glm53.pod.loopback import ContainerProcess, RunningPod
from glm53.pod.plan import ContainerPlan

BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
# How often a keeper looks for its container's exit between probes.
POLL_S = 0.2


@dataclass(frozen=True)
class RestartEvent:
    """One container started again: seconds since the kubelet loop began, which container, and why.

    `at_s` is unrounded: a fault suite compares it with the instant it injected a fault, and a kubelet that noticed
    the exit within 50 ms would otherwise be placed before it (rounded to tenths) and leave the fault's row."""

    at_s: float
    container: str
    reason: str


def backoff_s(restarts_so_far: int) -> float:
    """The wait before restart number `restarts_so_far + 1`: none for the first, then 10 s doubling to 300 s."""
    if restarts_so_far == 0:
        return 0.0
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** (restarts_so_far - 1)))


def restarts_on_exit(container: ContainerPlan, pod_restart_policy: str) -> bool:
    """Whether the kubelet starts `container` again after it exits (we only see exits of containers that were up)."""
    return container.sidecar or pod_restart_policy == "Always"


class Kubelet:
    """The after-Ready loop of one running pod; `restarts` lists what it did, in order."""

    def __init__(
        self,
        pod: RunningPod,
        say: Callable[[str], None],
        clock: Callable[[], float] | None = None,
        starting: Collection[str] = (),
    ) -> None:
        self.pod = pod
        self.say = say
        self.restarts: list[RestartEvent] = []
        # When each started-again (or `starting`) container passed its startup probe (or started, without one).
        self.started_again: list[RestartEvent] = []
        self._starting = frozenset(starting)
        # Set while a container's startup probe has passed and it has not exited since.
        self._up = {c.name: threading.Event() for c in pod.plan.containers if not c.init}
        for name, up in self._up.items():
            if name not in self._starting:
                up.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        started = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - started)
        self._held: dict[str, float] = {}
        self._held_until: dict[str, threading.Event] = {}
        self._threads = [
            threading.Thread(target=self._keep, args=(container,), name=f"kubelet-{container.name}", daemon=True)
            for container in pod.plan.containers
            if not container.init
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def hold_next_restart(self, name: str, seconds: float = 0.0, until: threading.Event | None = None) -> None:
        """Start `name` again no sooner than `seconds` after its next exit (a crash loop's back-off, a slow node), and,
        given `until`, not before it is set (a node that brings the container back when something else happened)."""
        with self._lock:
            self._held[name] = seconds
            if until is not None:
                self._held_until[name] = until

    def wait_started(self, name: str, timeout_s: float) -> bool:
        """Wait until `name` passed its startup probe (and has not exited since); False after `timeout_s`."""
        return self._up[name].wait(timeout_s)

    def restart_count(self, name: str) -> int:
        with self._lock:
            return sum(1 for event in self.restarts if event.container == name)

    def _record(self, container: str, reason: str) -> None:
        event = RestartEvent(self._clock(), container, reason)
        with self._lock:
            self.restarts.append(event)
        self.say(f"kubelet: t={event.at_s:.1f} s: restarting {container}: {reason}")

    def _wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; False when the loop is stopping."""
        return not self._stop.wait(max(0.0, seconds))

    def _keep(self, container: ContainerPlan) -> None:
        restarts = 0
        probed = container.name not in self._starting  # else the pod is Ready: every startup probe passed
        up_since = time.monotonic()
        failures = 0
        next_probe = time.monotonic()
        while not self._stop.is_set():
            process = self.pod.process(container.name)
            status = process.process.poll()
            if status is not None:
                self._up[container.name].clear()
                if not restarts_on_exit(container, self.pod.plan.restart_policy):
                    return
                if time.monotonic() - up_since > 2 * BACKOFF_MAX_S:
                    restarts = 0
                with self._lock:
                    delay = max(backoff_s(restarts), self._held.pop(container.name, 0.0))
                    until = self._held_until.pop(container.name, None)
                code = 128 - status if status < 0 else status  # killed by signal N: 128 + N, as the kubelet reports
                held = "" if until is None else ", then held"
                self._record(container.name, f"exited with status {code}; back-off {delay:g} s{held}")
                if not self._wait(delay):
                    return
                while until is not None and not until.is_set():
                    if not self._wait(POLL_S):
                        return
                self.pod.start(container)
                restarts, up_since, failures, probed = restarts + 1, time.monotonic(), 0, False
                next_probe = time.monotonic()
                continue
            if time.monotonic() >= next_probe:
                was_probed = probed
                probed, failures = self._probe(container, process, probed, failures)
                if probed and not was_probed:
                    with self._lock:
                        self.started_again.append(RestartEvent(self._clock(), container.name, "started"))
                    self._up[container.name].set()
                probe = container.liveness_probe if probed else container.startup_probe
                next_probe = time.monotonic() + (probe.period_s if probe else POLL_S)
            self._wait(POLL_S)

    def _probe(
        self, container: ContainerPlan, process: ContainerProcess, probed: bool, failures: int
    ) -> tuple[bool, int]:
        """One run of a started-again container's startup probe, or of its liveness probe; a spent budget kills it.

        Returns whether the startup probe has passed, and the consecutive failures so far.
        """
        probe = container.startup_probe if not probed else container.liveness_probe
        if probe is None:
            return True, 0
        code, line = process.probe(probe)
        if code == 0:
            return True, 0
        failures += 1
        if failures < probe.failure_threshold:
            return probed, failures
        which = "liveness" if probed else "startup"
        self.say(f"kubelet: {container.name}: {which} probe failed {failures} times ({line}); killing it")
        process.stop(self.pod.plan.grace_period_s)
        return probed, 0


@contextlib.contextmanager
def kubelet(
    pod: RunningPod,
    say: Callable[[str], None],
    clock: Callable[[], float] | None = None,
    starting: Collection[str] = (),
) -> Iterator[Kubelet]:
    """Keep `pod` alive as the kubelet would while the block runs; stop keeping it before the pod itself stops."""
    loop = Kubelet(pod, say, clock, starting)
    loop.start()
    try:
        yield loop
    finally:
        loop.stop()
