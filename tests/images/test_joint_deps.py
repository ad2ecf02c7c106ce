"""The serving image's joint dependency set: vLLM 0.33.0 and LMCache 0.5.6 resolved together, from released metadata.

Why: the image installs vLLM, then the LMCache wheel; LMCache 0.5.6 caps numpy, protobuf, prometheus_client,
opentelemetry-api and setuptools below what vLLM alone resolves, so without one shared constraints file the second
install silently downgrades the first. `docker/vllm-lmcache/constraints.txt` pins the joint set; these tests ask pip
(the image's Python 3.12, `--dry-run --report`, against the package index: no CUDA image or GPU needed) to resolve
both packages under it and prove the result satisfies every requirement either package declares, and that the file is
exactly that set. About a minute on CI's 2 cores (metadata only, cached by pip after the first run).

vLLM 0.34.0's set (`--vllm 0.34.0`, constraints-vllm0.34.0.txt) cannot meet LMCache 0.5.6's OpenTelemetry caps: uv
resolves it with the overrides joint_deps.py documents, pip reads every pinned distribution's metadata, and the check
passes naming exactly those exceptions (tests/images/test_otel_override_live.py runs LMCache under that OpenTelemetry).
"""

from __future__ import annotations

import glob
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.dockerkit import REPO_ROOT, load_image_script

# The joint resolution (a module fixture pytest-timeout counts) runs pip's resolver over both packages' metadata: over
# ten minutes while the other xdist worker keeps both cores busy.
pytestmark = pytest.mark.timeout(1800)
IMAGE_DIR = REPO_ROOT / "docker" / "vllm-lmcache"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
CONSTRAINTS = IMAGE_DIR / "constraints.txt"
CONSTRAINTS_034 = IMAGE_DIR / "constraints-vllm0.34.0.txt"
# What lmcache-0.5.6.dist-info/METADATA caps (its Requires-Dist lines) and vllm 0.33.0 alone resolves above the cap.
LMCACHE_CAPS = {
    "numpy": "<=2.2.6",
    "protobuf": "<7",
    "prometheus-client": "<=0.24.1",
    "opentelemetry-api": "<=1.40.0",
    "setuptools": "<81",
}


def joint_deps() -> ModuleType:
    """docker/vllm-lmcache/joint_deps.py."""
    return load_image_script(IMAGE_DIR / "joint_deps.py")


def image_python() -> str:
    """A Python 3.12 (the serving image's) that runs: pip evaluates requirement markers for its own interpreter only."""
    candidates = [
        "python3.12",
        "/usr/bin/python3.12",
        *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12"))),
    ]
    for candidate in candidates:
        try:
            probe = subprocess.run([candidate, "-m", "pip", "--version"], capture_output=True, check=False)
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.fail("expected a Python 3.12 with pip (the serving image's Python) on PATH or under ~/.pyenv; install one")


def uv() -> str:
    """The venv's uv (scripts/bootstrap.sh pins it), which resolves the overridden sets."""
    return str(Path(sys.executable).with_name("uv"))


def generation(name: str) -> object:
    """joint_deps.py's generation of vLLM ``name``."""
    return joint_deps().GENERATIONS[name]


@pytest.fixture(scope="module")
def joint_set() -> object:
    """The joint resolution under constraints.txt (the module's one slow call for 0.33.0)."""
    return joint_deps().check(image_python(), uv(), generation("0.33.0"), CONSTRAINTS)


@pytest.fixture(scope="module")
def joint_set_034() -> object:
    """The 0.34.0 joint resolution under constraints-vllm0.34.0.txt (uv, then pip's metadata of every pin)."""
    return joint_deps().check(image_python(), uv(), generation("0.34.0"), CONSTRAINTS_034)


@pytest.mark.slow
def test_constraints_are_a_joint_set_both_packages_accept(joint_set: object) -> None:
    module = joint_deps()
    versions: dict[str, str] = joint_set.versions  # type: ignore[attr-defined]

    assert versions["vllm"] == "0.33.0" and versions["lmcache"] == "0.5.6"
    assert module.unmet_requirements(joint_set, ["vllm", "lmcache"]) == []
    pinned = module.parse_constraints(CONSTRAINTS.read_text())
    assert module.drift(pinned, module.pins(joint_set, generation("0.33.0"))) == []
    # vLLM's own pin wins where LMCache is open (torch), LMCache's cap where vLLM is open (the rest).
    assert versions["torch"] == "2.14.0"
    for name, cap in LMCACHE_CAPS.items():
        assert module.Requirement(f"{name}{cap}").specifier.contains(versions[name]), (name, versions[name])


@pytest.mark.slow
def test_a_pin_lmcache_forbids_fails_in_one_line(tmp_path: Path) -> None:
    module = joint_deps()
    stale = tmp_path / "constraints.txt"
    stale.write_text(re.sub(r"(?m)^numpy==.*$", "numpy==2.3.5", CONSTRAINTS.read_text()))

    with pytest.raises(module.JointDepsError) as raised:
        module.check(image_python(), uv(), generation("0.33.0"), stale)

    message = str(raised.value)
    assert message.startswith("pip could not resolve the joint set: ERROR: Cannot install"), message
    assert "\n" not in message


def test_unmet_and_drifting_pins_are_named() -> None:
    module = joint_deps()
    resolution = module.Resolution(
        versions={"lmcache": "0.5.6", "numpy": "2.3.5"},
        requires={"lmcache": ("numpy<=2.2.6", "redis", "nixl>=1.3.0; extra == 'nixl'"), "numpy": ()},
        environment={"python_version": "3.12", "sys_platform": "linux"},
    )

    assert module.unmet_requirements(resolution, ["lmcache", "vllm"]) == [
        "lmcache requires numpy<=2.2.6 but the set has numpy 2.3.5",
        "lmcache requires redis but the set has no redis",
        "vllm is not in the set",
    ]
    assert module.drift({"numpy": "2.2.6", "six": "1.17.0"}, {"numpy": "2.3.5", "redis": "8.1.0"}) == [
        "numpy pinned 2.2.6, resolved 2.3.5",
        "redis pinned nowhere, resolved 8.1.0",
        "six pinned 1.17.0, resolved not at all",
    ]


def test_a_constraints_line_without_a_pin_is_refused() -> None:
    module = joint_deps()

    with pytest.raises(module.JointDepsError) as raised:
        module.parse_constraints("# header\nnumpy==2.2.6\ntorch>=2.14\n")

    assert str(raised.value) == "expected name==version on line 3 of the constraints file, found 'torch>=2.14'"


def test_the_file_is_generated_for_the_images_python() -> None:
    (python,) = re.findall(r"^ARG PYTHON_VERSION=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE)

    assert python == joint_deps().TARGET_PYTHON
    for name, file in (("0.33.0", CONSTRAINTS), ("0.34.0", CONSTRAINTS_034)):
        text = file.read_text()
        rendered = joint_deps().render_constraints(joint_deps().parse_constraints(text), generation(name))
        assert text == rendered, f"regenerate {file.name} with --write"


def test_both_installs_honour_the_constraints_and_pip_check_runs() -> None:
    text = DOCKERFILE.read_text()

    assert 'pip install -c /opt/glm53/share/constraints.txt "vllm==${VLLM_VERSION}"' in text
    assert "pip install -c /opt/glm53/share/constraints.txt /mnt/lmcache-*.whl" in text
    assert "python -m pip check" in text
    assert "--constraints /opt/glm53/share/constraints.txt" in text  # build_info.py checks and records the set


def test_build_info_refuses_a_version_other_than_the_pin(tmp_path: Path) -> None:
    record, constraints = tmp_path / "lmcache-build.json", tmp_path / "constraints.txt"
    record.write_text(json.dumps({"torch_built_against": "2.13.0"}))
    constraints.write_text("# pinned\nPyYAML==0.0.1\n")

    argv = [sys.executable, str(IMAGE_DIR / "build_info.py"), "--lmcache-build", str(record)]
    done = subprocess.run(
        [*argv, "--constraints", str(constraints), "--output", str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        check=False,
    )

    assert done.returncode == 1
    installed = load_image_script(IMAGE_DIR / "build_info.py").all_installed()["pyyaml"]
    assert done.stderr.splitlines() == [
        f"build-info: error: expected the versions constraints.txt pins but found pyyaml pinned 0.0.1, installed "
        f"{installed}; install with `pip install -c` or regenerate the file (joint_deps.py --write)."
    ]


@pytest.mark.slow
def test_the_034_set_departs_only_where_documented(joint_set_034: object) -> None:
    module = joint_deps()
    versions: dict[str, str] = joint_set_034.versions  # type: ignore[attr-defined]
    unmet = module.unmet_requirements(joint_set_034, versions)

    assert versions["vllm"] == "0.34.0" and versions["lmcache"] == "0.5.6" and versions["torch"] == "2.14.0"
    # Every distribution's requirements hold (pip check) but the two LMCache caps the overrides lift.
    assert unmet == [
        "lmcache requires opentelemetry-api<=1.40.0,>=1.20.0 but the set has "
        f"opentelemetry-api {versions['opentelemetry-api']}",
        "lmcache requires opentelemetry-exporter-prometheus<=0.61b0,>=0.50b0 but the set has "
        f"opentelemetry-exporter-prometheus {versions['opentelemetry-exporter-prometheus']}",
    ]
    assert versions["opentelemetry-sdk"].startswith("1.45.") and versions["flashinfer-python"] == "0.7.3"
    # LMCache's prometheus_client cap (the one LMCache PR #3000 fixed a test failure with) is kept, not overridden.
    assert versions["prometheus-client"] == "0.24.1"
    assert (
        module.drift(
            module.parse_constraints(CONSTRAINTS_034.read_text()), module.pins(joint_set_034, generation("0.34.0"))
        )
        == []
    )


def test_the_034_exceptions_are_documented_one_line_each() -> None:
    exceptions = generation("0.34.0").exceptions()  # type: ignore[attr-defined]

    assert [line.split(":")[0] for line in exceptions] == [
        "lmcache requires opentelemetry-api<=1.40.0,>=1.20.0",
        "lmcache requires opentelemetry-exporter-prometheus<=0.61b0,>=0.50b0",
        "flashinfer-python==0.7.3 pinned unresolved",
    ]
    assert all("\n" not in line and f"#   {line}" in CONSTRAINTS_034.read_text() for line in exceptions)
    assert generation("0.33.0").exceptions() == []  # type: ignore[attr-defined]


def test_an_unexpected_unmet_requirement_or_a_stale_exception_fails() -> None:
    module = joint_deps()
    resolution = module.Resolution(
        versions={"lmcache": "0.5.6", "opentelemetry-api": "1.40.0", "numpy": "2.3.5"},
        requires={
            "lmcache": ("opentelemetry-api<=1.40.0,>=1.20.0", "numpy<=2.2.6"),
            "opentelemetry-api": (),
            "numpy": (),
        },
        environment={"python_version": "3.12"},
    )

    problems = module.problems_beyond_exceptions(resolution, generation("0.34.0"))

    assert problems[0] == "lmcache requires numpy<=2.2.6 but the set has numpy 2.3.5"
    assert problems[1].startswith("the documented exception 'lmcache requires opentelemetry-api<=1.40.0,>=1.20.0: ")
    assert problems[1].endswith("' no longer occurs; drop its override")
    assert len(problems) == 3  # the exporter-prometheus override is stale here too


def test_an_unknown_generation_is_refused_in_one_line() -> None:
    argv = [sys.executable, str(IMAGE_DIR / "joint_deps.py"), "--vllm", "0.35.0", "--check"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)

    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "joint-deps: error: expected a known vLLM generation (0.33.0, 0.34.0) but got '0.35.0'"
    ]
