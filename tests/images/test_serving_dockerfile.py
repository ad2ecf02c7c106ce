"""The serving image's Dockerfile read as instructions (no engine, no build): what a real build found wrong stays fixed.

Why static: the image cannot be built on CI (its CUDA bases need a registry and an hour), yet each of these slips was
found only by a real build: pip cache mounts pip did not use (HOME pointed at the runtime user's home during root's pip
steps), a label and build-info.json naming the default CUDA base whatever base was used, an empty mount target left in
the image, and no early refusal of a Python that constraints.txt was not resolved for. The checks here read the
Dockerfile the way the builder does: logical lines, stages, the ARG scope of each stage and the ENV and USER a stage
inherits from its parent stage.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.dockerkit import REPO_ROOT, load_image_script

IMAGE_DIR = REPO_ROOT / "docker" / "vllm-lmcache"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
CHECK_PYTHON = IMAGE_DIR / "check-python.sh"
CONSTRAINTS = IMAGE_DIR / "constraints.txt"
# Home directories of the users RUN steps may run as (root's, from the base image's /etc/passwd).
HOMES = {"root": "/root", "0": "/root"}
# Variables the base images' own config provides (nvidia/cuda sets PATH, among others).
IMAGE_ENV = {"PATH"}


@dataclass
class Instruction:
    """One logical Dockerfile line: the keyword and its arguments, continuation lines joined."""

    keyword: str
    arguments: str


@dataclass
class Stage:
    """A build stage: what it starts from, its name, its instructions."""

    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)


def instructions(text: str) -> list[Instruction]:
    """The logical instructions of a Dockerfile: comments dropped (also inside continuations), `\\` lines joined."""
    logical: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, arguments = pending.partition(" ")
        logical.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    return logical


def stages(text: str) -> tuple[list[Instruction], list[Stage]]:
    """The global ARGs before the first FROM, and the stages in order."""
    preamble: list[Instruction] = []
    found: list[Stage] = []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            words = instruction.arguments.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(found))
            found.append(Stage(base=words[0], name=name))
        elif found:
            found[-1].instructions.append(instruction)
        else:
            preamble.append(instruction)
    return preamble, found


def env_assignments(arguments: str) -> dict[str, str]:
    """The `KEY=VALUE` pairs of an ENV instruction (quotes removed; the value unexpanded)."""
    return dict(word.split("=", 1) for word in shlex.split(arguments))


def arg_names(arguments: str) -> set[str]:
    """The names an ARG instruction declares (``ARG NAME`` or ``ARG NAME=default``)."""
    return {word.split("=", 1)[0] for word in arguments.split()}


@dataclass(frozen=True)
class RunContext:
    """A RUN instruction with the user it runs as and the ENV in effect there (inherited from parent stages)."""

    stage: str
    command: str
    user: str
    env: dict[str, str]


def run_contexts(text: str) -> list[RunContext]:
    """Every RUN with its user and ENV: a stage built `FROM` an earlier stage inherits that stage's final ENV and USER;
    one from an external image starts as root with no ENV of ours."""
    _, all_stages = stages(text)
    final: dict[str, tuple[str, dict[str, str]]] = {}
    contexts = []
    for stage in all_stages:
        user, env = final.get(stage.base, ("root", {}))
        env = dict(env)
        for instruction in stage.instructions:
            if instruction.keyword == "ENV":
                env.update(env_assignments(instruction.arguments))
            elif instruction.keyword == "USER":
                user = instruction.arguments.split(":", 1)[0]
            elif instruction.keyword == "RUN":
                contexts.append(RunContext(stage.name, instruction.arguments, user, dict(env)))
        final[stage.name] = (user, env)
    return contexts


def mounts(command: str) -> list[dict[str, str]]:
    """The `--mount=` options at the start of a RUN, each as its key=value fields."""
    found = []
    for word in shlex.split(command):
        if not word.startswith("--mount="):
            break
        found.append(dict(field.split("=", 1) for field in word.removeprefix("--mount=").split(",")))
    return found


def pip_cache_dir(user: str, env: dict[str, str]) -> str:
    """The cache directory pip uses for ``user`` under ``env``.

    pip 25.3: the --cache-dir default is USER_CACHE_DIR = appdirs.user_cache_dir("pip")
    (pip/_internal/locations/base.py:14), which is $XDG_CACHE_HOME/pip or ~/.cache/pip with ~ from $HOME
    (pip/_vendor/platformdirs/unix.py:107-110); PIP_CACHE_DIR overrides it like every option's PIP_* variable.
    """
    if "PIP_CACHE_DIR" in env:
        return env["PIP_CACHE_DIR"]
    if env.get("XDG_CACHE_HOME", "").strip():
        return f"{env['XDG_CACHE_HOME']}/pip"
    return f"{env.get('HOME', HOMES[user])}/.cache/pip"


def pip_cache_mismatches(text: str) -> list[str]:
    """Each pip cache mount whose target is not the directory pip uses in that step, as one phrase."""
    problems = []
    for context in run_contexts(text):
        for mount in mounts(context.command):
            if mount.get("type") == "cache" and mount["target"].endswith("/pip"):
                used = pip_cache_dir(context.user, context.env)
                if mount["target"] != used:
                    problems.append(f"stage {context.stage}: cache mount {mount['target']}, pip uses {used}")
    return problems


def serving() -> str:
    return DOCKERFILE.read_text(encoding="utf-8")


def stage(name: str) -> Stage:
    (found,) = [candidate for candidate in stages(serving())[1] if candidate.name == name]
    return found


# ---- pip cache mounts --------------------------------------------------------------------------------------------


def test_every_pip_cache_mount_is_the_cache_pip_uses() -> None:
    text = serving()
    pip_mounts = [
        mount
        for context in run_contexts(text)
        for mount in mounts(context.command)
        if mount.get("type") == "cache" and mount["target"].endswith("/pip")
    ]

    assert len(pip_mounts) == 5  # vLLM, the LMCache build, the LMCache wheel, the FlashInfer kernels, the toolkit
    assert pip_cache_mismatches(text) == []


def test_home_set_before_roots_pip_steps_is_caught() -> None:
    # The defect a real build showed ("The directory '/home/glm53/.cache/pip' ... is not owned ... The cache has been
    # disabled"): the runtime stage set HOME for its user in the ENV that precedes root's pip steps.
    before_the_fix = (
        "FROM ubuntu AS runtime\n"
        "ENV VIRTUAL_ENV=/opt/venv \\\n    HOME=/home/glm53\n"
        "RUN --mount=type=cache,target=/root/.cache/pip \\\n    python -m pip install x\n"
        "USER 10001:10001\n"
    )

    assert pip_cache_mismatches(before_the_fix) == [
        "stage runtime: cache mount /root/.cache/pip, pip uses /home/glm53/.cache/pip"
    ]


def test_home_is_the_image_users_only_from_the_user_instruction_on() -> None:
    runtime = stage("runtime").instructions
    keywords = [instruction.keyword for instruction in runtime]
    home_at = [
        index
        for index, instruction in enumerate(runtime)
        if instruction.keyword == "ENV" and "HOME" in env_assignments(instruction.arguments)
    ]

    assert home_at == [keywords.index("USER") - 1], "ENV HOME=... right before USER, after every root step"
    assert env_assignments(runtime[home_at[0]].arguments) == {"HOME": "/home/glm53"}
    assert "RUN" not in keywords[home_at[0] :]


# ---- the base images the image records ---------------------------------------------------------------------------


def test_the_base_label_and_build_info_name_the_images_actually_used() -> None:
    base, runtime = stage("base"), stage("runtime")
    run_text = " ".join(i.arguments for i in runtime.instructions if i.keyword == "RUN")
    (label,) = [i.arguments for i in runtime.instructions if i.keyword == "LABEL"]

    assert (base.base, runtime.base) == ("${CUDA_DEVEL_IMAGE}", "${CUDA_RUNTIME_IMAGE}")
    assert dict(word.split("=", 1) for word in shlex.split(label))["org.opencontainers.image.base.name"] == (
        "${CUDA_RUNTIME_IMAGE}"
    )
    assert '--set "cuda_image=${CUDA_RUNTIME_IMAGE}"' in run_text
    assert '--set "cuda_devel_image=${CUDA_DEVEL_IMAGE}"' in run_text
    assert "nvidia/cuda" not in label + run_text


def test_every_variable_a_stage_expands_is_declared_in_it() -> None:
    # A global ARG (one before the first FROM) is empty inside a stage that does not declare it again, so a
    # label reading ${CUDA_RUNTIME_IMAGE} without `ARG CUDA_RUNTIME_IMAGE` in the stage would silently say "".
    preamble, all_stages = stages(serving())
    global_args = set().union(*(arg_names(i.arguments) for i in preamble if i.keyword == "ARG"))
    inherited_env: dict[str, set[str]] = {}
    undeclared = []
    for each in all_stages:
        assert set(re.findall(r"\$\{(\w+)", each.base)) <= global_args, each.base
        declared = IMAGE_ENV | inherited_env.get(each.base, set())
        for instruction in each.instructions:
            used = set(re.findall(r"\$\{(\w+)", instruction.arguments))
            undeclared += [f"{each.name}: {instruction.keyword} uses {name}" for name in sorted(used - declared)]
            if instruction.keyword == "ARG":
                declared |= arg_names(instruction.arguments)
            elif instruction.keyword == "ENV":
                declared |= set(env_assignments(instruction.arguments))
        inherited_env[each.name] = declared - {
            name for i in each.instructions if i.keyword == "ARG" for name in arg_names(i.arguments)
        }

    assert undeclared == []


def test_build_info_records_the_base_image_references_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_info = load_image_script(IMAGE_DIR / "build_info.py")
    monkeypatch.setattr(
        build_info,
        "installed_versions",
        lambda names: {"python": "3.12.3", "vllm": "0.33.0", "torch": "2.14.0", "lmcache": "0.5.6"},
    )
    record, output = tmp_path / "lmcache-build.json", tmp_path / "build-info.json"
    record.write_text(json.dumps({"torch_built_against": "2.14.0", "cuda": "13.0.88"}))
    mirror = "registry.example:5000/mirror/cuda:13.0.1-runtime-ubuntu24.04@sha256:" + "c3" * 32

    status = build_info.main(["--lmcache-build", str(record), "--output", str(output), "--set", f"cuda_image={mirror}"])

    assert status == 0
    assert json.loads(output.read_text())["cuda_image"] == mirror


# ---- the LMCache wheel mount -------------------------------------------------------------------------------------


def test_the_lmcache_wheel_mount_leaves_nothing_in_the_image() -> None:
    # BuildKit creates a missing mount target in the layer and keeps it (empty); the step cannot rmdir it while it is
    # mounted (measured: "Device or resource busy"). So bind mounts go over /mnt, which the Ubuntu base already has.
    binds = [
        mount for context in run_contexts(serving()) for mount in mounts(context.command) if mount.get("type") == "bind"
    ]

    assert [(mount["from"], mount["source"], mount["target"]) for mount in binds] == [("build", "/dist", "/mnt")]
    assert not [i for i in instructions(serving()) if "/tmp/lmcache-dist" in i.arguments]


# ---- the Python the constraints were resolved for ----------------------------------------------------------------


def fake_python(directory: Path, version: str) -> Path:
    """An interpreter stand-in that answers check-python.sh's version question with ``version``."""
    path = directory / f"python{version}"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def check_python(python: Path | str, constraints: Path = CONSTRAINTS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CHECK_PYTHON), str(python), str(constraints)], capture_output=True, text=True, check=False
    )


def test_the_constraints_record_the_python_they_were_resolved_for() -> None:
    (recorded,) = re.findall(r"^# python-version: (\S+)$", CONSTRAINTS.read_text(), flags=re.MULTILINE)
    (default,) = re.findall(r"^ARG PYTHON_VERSION=(\S+)$", serving(), flags=re.MULTILINE)

    assert recorded == default == load_image_script(IMAGE_DIR / "joint_deps.py").TARGET_PYTHON


def test_the_python_check_runs_before_anything_is_installed() -> None:
    runs = [i.arguments for i in stage("base").instructions if i.keyword == "RUN"]
    (first_pip,) = [index for index, command in enumerate(runs) if "pip install" in command][:1]
    command = runs[first_pip]
    check = 'bash /opt/glm53/libexec/check-python.sh "python${PYTHON_VERSION}" /opt/glm53/share/constraints.txt'

    assert check in command
    assert command.index(check) < command.index("-m venv") < command.index("pip install")


def test_another_python_than_the_constraints_fails_in_one_sentence(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "3.11")

    done = check_python(python)

    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"check-python: error: expected Python 3.12, the only one constraints.txt was resolved for, but {python} is "
        "3.11; build with --build-arg PYTHON_VERSION=3.12, or set TARGET_PYTHON in joint_deps.py to 3.11 and "
        "regenerate constraints.txt (joint_deps.py --python python3.11 --write)."
    ]


def test_the_python_the_constraints_were_resolved_for_passes(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "3.12")

    done = check_python(python)

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"check-python: {python} is Python 3.12, the one constraints.txt was resolved for.\n"


def test_the_check_asks_the_real_interpreter(tmp_path: Path) -> None:
    found = f"{sys.version_info.major}.{sys.version_info.minor}"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"# python-version: {found}\nnumpy==2.2.6\n")

    assert check_python(sys.executable, constraints).returncode == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["python3"], "expected PYTHON and CONSTRAINTS but got 1 argument(s); see the usage line of {script}."),
        (
            ["python3", "/nonexistent/constraints.txt"],
            "expected the constraints file at /nonexistent/constraints.txt but cannot read it.",
        ),
        (
            ["/nonexistent/python3.12", "{constraints}"],
            "expected a Python interpreter at '/nonexistent/python3.12' but "
            "it does not run; set PYTHON_VERSION to an installed python3.X.",
        ),
        (
            ["python3", "{unmarked}"],
            "expected a '# python-version: X.Y' line in {unmarked} but found none; regenerate "
            "it with joint_deps.py --write.",
        ),
    ],
    ids=["usage", "no-constraints", "no-python", "no-version-line"],
)
def test_the_check_rejects_bad_input_in_one_sentence(argv: list[str], message: str, tmp_path: Path) -> None:
    unmarked = tmp_path / "constraints.txt"
    unmarked.write_text("numpy==2.2.6\n")
    values = {"script": str(CHECK_PYTHON), "constraints": str(CONSTRAINTS), "unmarked": str(unmarked)}

    done = subprocess.run(
        ["bash", str(CHECK_PYTHON), *(word.format(**values) for word in argv)],
        capture_output=True,
        text=True,
        check=False,
    )

    assert (done.returncode, done.stderr) == (1, f"check-python: error: {message.format(**values)}\n")


def test_the_python_version_argument_is_checked_before_apt_installs_anything() -> None:
    # Ubuntu 24.04 has no python3.11 package: checked only after apt, PYTHON_VERSION=3.11 would stop in apt's words.
    runs = [i.arguments for i in stage("base").instructions if i.keyword == "RUN"]

    assert runs[0] == 'bash /opt/glm53/libexec/check-python.sh "${PYTHON_VERSION}" /opt/glm53/share/constraints.txt'
    assert "apt-get install" in runs[1]


def test_another_python_version_argument_fails_in_one_sentence() -> None:
    done = check_python("3.11")

    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [
        "check-python: error: expected Python 3.12, the only one constraints.txt was resolved for, but PYTHON_VERSION "
        "is 3.11; build with --build-arg PYTHON_VERSION=3.12, or set TARGET_PYTHON in joint_deps.py to 3.11 and "
        "regenerate constraints.txt (joint_deps.py --python python3.11 --write)."
    ]


def test_the_python_version_argument_the_constraints_were_resolved_for_passes() -> None:
    done = check_python("3.12")

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "check-python: PYTHON_VERSION is Python 3.12, the one constraints.txt was resolved for.\n"


# ---- FlashInfer's precompiled kernels ----------------------------------------------------------------------------


def flashinfer_run() -> str:
    (command,) = [c.command for c in run_contexts(serving()) if "flashinfer download-kernels" in c.command]
    return command


def test_flashinfer_kernels_are_downloaded_by_default_in_the_runtime_stage() -> None:
    # vLLM 0.33 vllm/utils/flashinfer.py:88-106: without flashinfer-cubin (and with no nvcc in the runtime stage)
    # has_flashinfer() is False and every FlashInfer backend is off.
    (default,) = re.findall(r"^ARG FLASHINFER_KERNELS=(\S+)$", serving(), flags=re.MULTILINE)
    runtime_args = {
        name for i in stage("runtime").instructions if i.keyword == "ARG" for name in arg_names(i.arguments)
    }
    (context,) = [c for c in run_contexts(serving()) if "flashinfer download-kernels" in c.command]

    assert default == "download"
    assert {"FLASHINFER_KERNELS", "FLASHINFER_INDEX_URL", "TORCH_CUDA_ARCH_LIST"} <= runtime_args
    assert (context.stage, context.user) == ("runtime", "root")
    assert {"type": "cache", "target": "/root/.cache/pip"} in mounts(context.command)


def test_flashinfer_kernels_come_for_the_arch_list_at_flashinfer_python_s_version() -> None:
    command = flashinfer_run()

    # One --sm per TORCH_CUDA_ARCH_LIST entry (FlashInfer's `--sm` takes 9.0 as sm90), the index overridable, and
    # the versions checked equal afterwards: FlashInfer refuses kernels of another version.
    assert "$(printf -- '--sm=%s ' ${TORCH_CUDA_ARCH_LIST//+PTX/})" in command
    assert '--cubin-index-url "${FLASHINFER_INDEX_URL}"' in command
    assert '--jit-cache-index-url "${FLASHINFER_INDEX_URL}/cu$(tr -d . <<<"$cuda")"' in command
    assert '("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")' in command
    assert "none) " in command and "*) " in command and "exit 1" in command


def test_flashinfer_kernels_come_after_the_lmcache_wheel_and_before_build_info() -> None:
    runs = [i.arguments for i in stage("runtime").instructions if i.keyword == "RUN"]
    position = {
        name: next(n for n, run in enumerate(runs) if marker in run)
        for name, marker in [
            ("lmcache", "/mnt/lmcache-*.whl"),
            ("flashinfer", "flashinfer download-kernels"),
            ("build-info", "build_info.py"),
        ]
    }

    assert position["lmcache"] < position["flashinfer"] < position["build-info"]
    assert '--set "flashinfer_kernels=${FLASHINFER_KERNELS}"' in runs[position["build-info"]]
