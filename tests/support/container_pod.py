"""The Docker runner of the chart's pod: each container of the rendered plan given to Docker as a kubelet would run it.

Why a second runner beside the loopback one (`glm53.pod.loopback`): only containers show what the images do with the
chart's security context, limits, volumes and exec probes, and how a native sidecar restarted by its runtime comes back
into the pod's namespaces. It runs the plan `glm53.pod.plan` reads from the chart, unchanged; the tests of
tests/images/test_container_pod.py drive it on the suite's private Docker engine (tests/support/dockerkit.py).
"""

from __future__ import annotations

import time
import uuid

import pytest
from docker.errors import APIError
from docker.models.containers import Container
from docker.types import Mount

import docker
from glm53.pod.loopback import SHM
from glm53.pod.plan import ContainerPlan, ExecProbe, PodPlan

# Upper bound on any one wait, whatever the rendered probe budget says (the mock loads in seconds, the budget of the
# real engine's startup probe is an hour).
WAIT_CAP_S = 120.0


class ContainerPod:
    """Rendered pods' containers on a Docker engine, each pod around a sandbox container (Kubernetes' pause container).

    The sandbox owns the pod's IPC namespace (so its /dev/shm), and the first pod's sandbox owns the one network
    namespace every pod here shares: a container that exits and is started again comes back into the same namespaces,
    which it would take along if it owned them. Containers restart as the kubelet restarts them: a native sidecar
    always, a main container per the pod's `restartPolicy`, through Docker's own restart policy (at once the first
    time, then Docker's back-off, 100 ms doubling, where the kubelet's is 10 s doubling to 300 s). Volumes are per pod,
    like Kubernetes': Docker volumes named after the pod, made as the kubelet makes an emptyDir, except in-memory
    emptyDirs (tmpfs).
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.prefix = f"glm53-pod-{uuid.uuid4().hex[:8]}"
        self.volume_names: set[str] = set()
        self.started: list[Container] = []
        self.sandboxes: dict[str, Container] = {}

    def _mounts(self, pod: PodPlan, container: ContainerPlan) -> list[Mount]:
        volumes = {v.name: v for v in pod.volumes}
        mounts: list[Mount] = []
        for mount in container.mounts:
            volume = volumes[mount.volume]
            if volume.in_memory and mount.path == SHM:
                continue  # the sandbox's /dev/shm, shared through its IPC namespace (`shm_size`)
            if volume.in_memory:
                mounts.append(Mount(target=mount.path, source=None, type="tmpfs", tmpfs_size=volume.size_bytes))
            else:
                name = self._empty_dir(f"{self.prefix}-{pod.name}-{volume.name}", container.image)
                mounts.append(
                    Mount(target=mount.path, source=name, type="volume", read_only=mount.read_only, no_copy=True)
                )
        return mounts

    @staticmethod
    def shm_size(pod: PodPlan) -> int | None:
        """The size of the in-memory volume any container of `pod` mounts at /dev/shm: Docker mounts its own /dev/shm
        in the IPC namespace's owner (64 MiB by default), so the sandbox sizes that one instead of shadowing it."""
        volumes = {v.name: v for v in pod.volumes}
        shm = (volumes[m.volume] for c in pod.containers for m in c.mounts if m.path == SHM)
        return next((volume.size_bytes for volume in shm if volume.in_memory), None)

    def _empty_dir(self, name: str, image: str) -> str:
        """The Docker volume `name`, made the first time like a kubelet's emptyDir: empty and mode 0777
        (kubernetes pkg/volume/emptydir/empty_dir.go: `const perm os.FileMode = 0777`), so any pod user writes it
        (the tiny-model init container writes /models as 10001). Mounted with `nocopy`: Docker would otherwise fill
        it with the image's files at that path and take their owner, which no kubelet does."""
        if name not in self.volume_names:
            self.client.volumes.create(name)
            self.volume_names.add(name)
            self.client.containers.run(
                image,
                entrypoint=["chmod", "0777", "/volume"],
                user="0",
                mounts=[Mount(target="/volume", source=name, type="volume", no_copy=True)],
                network_mode="none",
                remove=True,
            )
        return name

    @property
    def network_owner(self) -> Container | None:
        """The first pod's sandbox, which holds the network namespace every pod here shares; None before any pod."""
        return next(iter(self.sandboxes.values()), None)

    def sandbox(self, pod: PodPlan) -> Container:
        """The sandbox of `pod`, started the first time it is asked for: the pod's first container's image doing
        nothing under tini, with no privileges, /dev/shm sized from the pod's in-memory /dev/shm volume."""
        if pod.name in self.sandboxes:
            return self.sandboxes[pod.name]
        like = pod.containers[0]
        first = self.network_owner
        sandbox: Container = self.client.containers.run(
            like.image,
            entrypoint=["/usr/bin/tini", "--", "sleep", "infinity"],
            name=f"{self.prefix}-{pod.name}-sandbox",
            detach=True,
            user=like.user or "",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            shm_size=self.shm_size(pod),
            network_mode="none" if first is None else f"container:{first.id}",
            ipc_mode="shareable",
        )
        self.started.append(sandbox)
        self.sandboxes[pod.name] = sandbox
        return sandbox

    def start(self, pod: PodPlan, container: ContainerPlan, argv: list[str] | None = None) -> Container:
        """Start one container of `pod` in its sandbox's namespaces, restarted when it exits as the kubelet would."""
        command = argv if argv is not None else list(container.argv)
        mounts = self._mounts(pod, container)
        sandbox = self.sandbox(pod)
        network_owner = self.network_owner
        assert network_owner is not None  # the sandbox just asked for is one
        # Secrets are the cluster's: this runner has none to give (the shared L2 tier's password runs on loopback).
        assert not container.secret_env, f"{container.name} reads Secrets {container.secret_env}; run it on loopback"
        restarts = container.sidecar or (pod.restart_policy == "Always" and not container.init)
        # Kubernetes semantics: `command` replaces the image's ENTRYPOINT, `args` alone follow it.
        entrypoint, arguments = (command[:1], command[1:]) if container.overrides_entrypoint else (None, command)
        started: Container = self.client.containers.run(
            container.image,
            entrypoint=entrypoint,
            command=arguments,
            name=f"{self.prefix}-{pod.name}-{container.name}",
            detach=True,
            environment=dict(container.env),
            user=container.user or "",
            read_only=container.read_only_root,
            cap_drop=list(container.cap_drop),
            security_opt=["no-new-privileges"] if container.no_new_privileges else [],
            mem_limit=container.memory_limit_bytes or 0,
            nano_cpus=container.nano_cpus or 0,
            mounts=mounts,
            network_mode=f"container:{network_owner.id}",
            ipc_mode=f"container:{sandbox.id}",
            restart_policy={"Name": "always"} if restarts else None,
        )
        self.started.append(started)
        return started

    def wait_probe(self, running: Container, name: str, probe: ExecProbe, cap_s: float = WAIT_CAP_S) -> str:
        """Execute an exec probe inside `running` like the kubelet, until it exits 0 (within its budget, at most
        `cap_s`); its output."""
        deadline = time.monotonic() + min(probe.budget_s, cap_s)
        while True:
            running.reload()
            if running.status != "running" or int(running.attrs["RestartCount"]) > 0:
                pytest.fail(f"container {name} exited while probing ({running.status}); logs:\n{self.logs(running)}")
            try:
                exit_code, output = running.exec_run(list(probe.command), demux=False)
            except APIError as error:  # it exited after the check above, and Docker is restarting it
                pytest.fail(f"container {name} exited while probing ({error.explanation}); logs:\n{self.logs(running)}")
            text = output.decode(errors="replace").strip() if isinstance(output, bytes) else ""
            if exit_code == 0:
                return text
            if time.monotonic() > deadline:
                pytest.fail(
                    f"probe of {name} still exits {exit_code} ({text}) after the deadline; logs:\n{self.logs(running)}"
                )
            time.sleep(min(probe.period_s, 0.5))

    @staticmethod
    def logs(container: Container) -> str:
        logs = container.logs(tail=400, stream=False)
        return logs.decode(errors="replace") if isinstance(logs, bytes) else ""

    def stop(self) -> None:
        """Stop the engine before the sidecar (the kubelet's order), then remove containers and volumes."""
        for container in reversed(self.started):
            container.stop(timeout=10)
            container.remove(force=True)
        for volume in self.client.volumes.list():
            if volume.name in self.volume_names:
                volume.remove(force=True)
        leftovers = [c.name for c in self.client.containers.list(all=True) if (c.name or "").startswith(self.prefix)]
        assert not leftovers, f"containers left behind: {leftovers}"
