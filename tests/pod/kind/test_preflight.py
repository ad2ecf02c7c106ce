"""What the smoke test needs of the machine: versions read from real tools' outputs, and the requirements that follow
the node image. The judgements' messages are asserted through whole preflight runs in test_run.py.
"""

from __future__ import annotations

import pytest

from glm53.pod.kind.preflight import NODE_IMAGE, Version, node_image_kubernetes, parse_version, tool_requirements


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("Docker version 28.2.2, build e6534b4", (28, 2, 2)),
        ("kind v0.33.0 go1.25.1 linux/amd64", (0, 33, 0)),
        ("kind version v0.31.0 (default image kindest/node:v1.35.0@sha256:452d)", (0, 31, 0)),
        ("Client Version: v1.32.4-dispatcher\nKustomize Version: v5.5.0", (1, 32, 4)),
        ('Client Version: version.Info{Major:"1", Minor:"27", GitVersion:"v1.27.3"}', (1, 27, 3)),
        ("v3.10.1+g9f88ccb", (3, 10, 1)),
        ("v4.0", (4, 0, 0)),
        ("no digits here", None),
    ],
)
def test_versions_are_read_from_real_tool_outputs(output: str, version: Version | None) -> None:
    assert parse_version(output) == version


def test_kubectl_minimum_follows_the_node_image() -> None:
    by_name = {r.name: r for r in tool_requirements()}
    assert by_name["kubectl"].minimum == (1, 33, 0)
    newer = "kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5"
    assert {r.name: r for r in tool_requirements(newer)}["kubectl"].minimum == (1, 36, 0)
    assert node_image_kubernetes(NODE_IMAGE) == (1, 34, 11)
