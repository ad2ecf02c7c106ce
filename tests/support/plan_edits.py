"""Edits of a rendered pod that the chart refuses to render, as a hand-edited Deployment would carry them: how the
tests start a pod the probe and the alerts must refuse."""

from __future__ import annotations

import dataclasses

from glm53.pod.main_job import PodPlans
from glm53.pod.plan import ContainerPlan


def with_chunk_size(plans: PodPlans, chunk_size: int) -> PodPlans:
    """`plans` with every `--chunk-size` of the serving pod replaced: in the sidecar's command and in the engine's
    startup probe (the chart renders a size the model's block divides; lmcache.chunkSize must be a multiple of it)."""
    containers = tuple(_with_chunk_size(c, chunk_size) for c in plans.serving.containers)
    return dataclasses.replace(plans, serving=dataclasses.replace(plans.serving, containers=containers))


def _with_chunk_size(container: ContainerPlan, chunk_size: int) -> ContainerPlan:
    def replaced(argv: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(str(chunk_size) if i and argv[i - 1] == "--chunk-size" else part for i, part in enumerate(argv))

    probe = container.startup_probe
    return dataclasses.replace(
        container,
        argv=replaced(container.argv),
        startup_probe=None if probe is None else dataclasses.replace(probe, command=replaced(probe.command)),
    )
