"""The serving image's proof on a CPU machine: inputs hash, in-image checks and the record (docs/serving-image.md).

scripts/image-proof.sh makes the substitute bases, runs the daemon and the playbook; this file does the parts that are
data: which files are the image's inputs and their hash (CI compares it with the record,
tests/images/test_image_proof.py), the checks run inside the built image (`check`), and the Markdown written from the
run's results (`render`). It runs on the host with the project's .venv Python, never in the image.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

PROG = "image-proof"
# What the image is built from, besides the toolkit (src/, pyproject.toml, README.md: copied in, but they change with
# every feature and are tested on their own): the Dockerfile and every file of docker/vllm-lmcache it copies. A change
# to any of them needs the proof run again (CI fails until the record matches).
INPUTS = (
    "docker/vllm-lmcache/Dockerfile",
    "docker/vllm-lmcache/constraints.txt",
    "docker/vllm-lmcache/check-python.sh",
    "docker/vllm-lmcache/build-lmcache.sh",
    "docker/vllm-lmcache/build-requirements.txt",
    "docker/vllm-lmcache/verify_lmcache.py",
    "docker/vllm-lmcache/build_info.py",
)
# The record's line that CI reads (tests/images/test_image_proof.py).
HASH_LINE = "Inputs hash (sha256): `{}`"
HASH_PATTERN = re.compile(r"^Inputs hash \(sha256\): `([0-9a-f]{64})`$", re.MULTILINE)
UPSTREAM_PARSE = "tests/support/upstream_parse.py"
IMAGE_USER = "10001:10001"
TIMEOUT_S = 600


class ProofError(Exception):
    """A missing or unreadable result; its message is the one line printed."""


# ---- inputs ------------------------------------------------------------------------------------------------------


def input_digests(repo_root: Path) -> dict[str, str]:
    """The sha256 of each input file, by its path from the repository root."""
    return {path: hashlib.sha256((repo_root / path).read_bytes()).hexdigest() for path in INPUTS}


def inputs_hash(digests: Mapping[str, str]) -> str:
    """One hash of all inputs: the sha256 of `sha256sum`'s lines for them (`<hex>  <path>`), in INPUTS order."""
    listing = "".join(f"{digests[path]}  {path}\n" for path in INPUTS)
    return hashlib.sha256(listing.encode()).hexdigest()


def recorded_hash(record: str) -> str | None:
    """The inputs hash a record states, or None when it states none."""
    found = HASH_PATTERN.search(record)
    return found.group(1) if found else None


def recorded_digests(record: str) -> dict[str, str]:
    """The per-file digests of a record's inputs table (`| path | sha256 |` rows)."""
    rows = re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", record, flags=re.MULTILINE)
    return dict(rows)


# ---- checks inside the image -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One in-image check: what ran, whether it passed, what it printed (trimmed), how long it took."""

    name: str
    command: str
    passed: bool
    detail: str
    seconds: float


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    seconds: float


class Image:
    """The built image, run through one docker CLI with its entrypoint replaced and no network."""

    def __init__(self, docker: str, reference: str, mounts: Sequence[str] = ()) -> None:
        self.docker = docker
        self.reference = reference
        self.mounts = list(mounts)

    def run(self, entrypoint: str, *args: str, env: Mapping[str, str] | None = None, stdin: str = "") -> Run:
        command = [self.docker, "run", "--rm", "-i", "--network=none", "--entrypoint", entrypoint]
        for key, value in (env or {}).items():
            command += ["--env", f"{key}={value}"]
        for mount in self.mounts:
            command += ["--volume", mount]
        started = time.monotonic()
        done = subprocess.run(
            [*command, self.reference, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        return Run(done.returncode, (done.stdout + done.stderr).strip(), time.monotonic() - started)

    def inspect(self) -> dict[str, Any]:
        done = subprocess.run(
            [self.docker, "image", "inspect", self.reference], capture_output=True, text=True, check=True
        )
        found: dict[str, Any] = json.loads(done.stdout)[0]
        return found

    def history(self) -> list[dict[str, Any]]:
        done = subprocess.run(
            [self.docker, "history", "--no-trunc", "--human=false", "--format", "{{json .}}", self.reference],
            capture_output=True,
            text=True,
            check=True,
        )
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(ANSI.sub("", text).splitlines()[-lines:])


def _json_line(output: str) -> dict[str, Any]:
    """The last line of `output` that is a JSON object (upstream loggers print before it)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            found: dict[str, Any] = json.loads(line)
            return found
    raise ProofError(f"expected a JSON line in the output but found none: {_tail(output)}")


IMPORTS = """
import json, torch, vllm, lmcache, lmcache.cuda_ops, importlib.metadata as m
print(json.dumps({"torch": torch.__version__, "torch_cuda": torch.version.cuda, "vllm": vllm.__version__,
                  "lmcache": m.version("lmcache"), "cuda_ops": lmcache.cuda_ops.__file__}))
"""

FLASHINFER = """
import json, importlib.metadata as m
from vllm.utils.flashinfer import has_flashinfer, has_flashinfer_cubin
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
print(json.dumps({"has_flashinfer": has_flashinfer(), "has_flashinfer_cubin": has_flashinfer_cubin(),
                  **{d: version(d) for d in ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")}}))
"""


def chart_commands(chart_yaml: str) -> dict[str, list[str]]:
    """The engine pod's command lines as the chart renders them: vllm serve, lmcache server, the startup probe."""
    docs = [doc for doc in yaml.safe_load_all(chart_yaml) if isinstance(doc, dict)]
    workloads = [d for d in docs if d.get("kind") in ("Deployment", "StatefulSet")]
    if not workloads:
        raise ProofError("expected a Deployment or StatefulSet in the rendered chart but found none")
    spec = workloads[0]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}

    def program(name: str, words: Sequence[str]) -> list[str]:
        args: list[str] = containers[name]["args"]
        start = args.index("--") + 1
        if args[start : start + len(words)] != list(words):
            raise ProofError(f"expected the {name} container to run {' '.join(words)} but it runs {args[start:]}")
        return args[start + len(words) :]

    return {
        "vllm": program("vllm", ("vllm", "serve")),
        "lmcache": program("lmcache", ("lmcache", "server")),
        "probe": list(containers["vllm"]["startupProbe"]["exec"]["command"]),
    }


def _parse_with_upstream(image: Image, tool: str, argv: list[str], out_dir: Path) -> tuple[Run, dict[str, Any]]:
    """Parse `argv` with the image's own vLLM or LMCache parser (tests/support/upstream_parse.py, mounted in)."""
    out = out_dir / f"{tool}-parse.json"
    out.unlink(missing_ok=True)
    run = image.run(
        "/opt/venv/bin/python",
        "/proof/upstream_parse.py",
        tool,
        f"/proof/out/{out.name}",
        stdin=json.dumps([argv]),
    )
    results: list[dict[str, Any]] = json.loads(out.read_text()) if out.exists() else [{"error": _tail(run.output)}]
    return run, results[0]


def _check(name: str, command: str, run: Run, passed: bool, detail: str) -> Check:
    return Check(name=name, command=command, passed=passed, detail=detail, seconds=round(run.seconds, 1))


def run_checks(
    image: Image, repo_root: Path, chart_yaml: str, build_args: Mapping[str, str], out_dir: Path
) -> list[Check]:
    """Every in-image check, in order; each is recorded whether it passes or not."""
    checks: list[Check] = []

    run = image.run("/opt/venv/bin/python", "-c", IMPORTS)
    try:
        found = _json_line(run.output)
        ok = run.returncode == 0 and found["cuda_ops"].endswith(".so")
        detail = ", ".join(f"{k} {v}" for k, v in found.items())
    except ProofError as error:
        ok, detail = False, str(error)
    checks.append(_check("imports", "python -c 'import torch, vllm, lmcache, lmcache.cuda_ops'", run, ok, detail))

    run = image.run("/opt/glm53/bin/verify-lmcache")
    checks.append(
        _check("verify-lmcache", "/opt/glm53/bin/verify-lmcache", run, run.returncode == 0, _tail(run.output))
    )

    for venv in ("/opt/venv", "/opt/glm53/venv"):
        run = image.run(f"{venv}/bin/python", "-m", "pip", "check")
        checks.append(
            _check(f"pip check {venv}", f"{venv}/bin/python -m pip check", run, run.returncode == 0, run.output)
        )

    checks.append(_build_info_check(image, repo_root, build_args))

    config = image.inspect()["Config"]
    base_label = (config.get("Labels") or {}).get("org.opencontainers.image.base.name")
    run = image.run("/bin/sh", "-c", 'test ! -e /tmp/lmcache-dist && test -z "$(ls -A /mnt)" && echo clean')
    checks.append(
        _check(
            "base image label, no build leftovers",
            "label org.opencontainers.image.base.name; test ! -e /tmp/lmcache-dist; ls -A /mnt",
            run,
            base_label == build_args.get("CUDA_RUNTIME_IMAGE") and run.output == "clean",
            f"base.name {base_label}; /tmp/lmcache-dist absent and /mnt empty: {run.output == 'clean'}",
        )
    )

    user = config.get("User", "")
    run = image.run("/usr/bin/id", "-u")
    checks.append(
        _check(
            "non-root user",
            "image Config.User; id -u",
            run,
            user == IMAGE_USER and run.output == "10001",
            f"Config.User {user!r}, id -u {run.output}",
        )
    )

    commands = chart_commands(chart_yaml)
    probe = commands["probe"]
    run = image.run(probe[0], *probe[1:])
    # glm53 probe startup: exit 3 ("not yet") naming the logs that do not exist yet; 2 would be a usage error.
    checks.append(
        _check(
            "glm53 probe (the chart's startupProbe)",
            " ".join(probe),
            run,
            run.returncode == 3 and "no file at /var/log/glm53/vllm.log" in run.output,
            f"exit {run.returncode}: {_tail(run.output, 2)}",
        )
    )

    run, parsed = _parse_with_upstream(image, "lmcache", commands["lmcache"], out_dir)
    ok = "ok" in parsed and parsed["ok"]["args"].get("chunk_size") == 1152
    detail = (
        f"chunk_size {parsed['ok']['args'].get('chunk_size')}, port {parsed['ok']['args'].get('port')}"
        if "ok" in parsed
        else str(parsed.get("error"))
    )
    checks.append(
        _check(
            "lmcache server argv (the chart's sidecar)",
            "lmcache server " + " ".join(commands["lmcache"]),
            run,
            ok,
            detail,
        )
    )

    run, parsed = _parse_with_upstream(image, "vllm", commands["vllm"], out_dir)
    if "ok" in parsed:
        engine = parsed["ok"]["engine"]
        ok = engine.get("model") == "zai-org/GLM-5.3-Flash" and engine.get("kv_transfer_config") is not None
        detail = (
            f"model {engine.get('model')}, tensor_parallel_size {engine.get('tensor_parallel_size')}, "
            f"enable_prefix_caching {engine.get('enable_prefix_caching')}, kv connector "
            f"{(engine.get('kv_transfer_config') or {}).get('kv_connector')}"
        )
    else:
        ok, detail = False, str(parsed.get("error"))
    checks.append(
        _check("vllm serve argv (the chart's engine)", "vllm serve " + " ".join(commands["vllm"]), run, ok, detail)
    )

    run = image.run("python3", "-c", "import sys; print(sys.executable)")
    checks.append(
        _check(
            "python3 for the chart's exec probes",
            "python3 -c 'import sys; print(sys.executable)'",
            run,
            run.returncode == 0 and run.output == "/opt/venv/bin/python3",
            run.output,
        )
    )

    checks.append(_flashinfer_check(image, build_args.get("FLASHINFER_KERNELS", "download")))
    return checks


def _build_info_check(image: Image, repo_root: Path, build_args: Mapping[str, str]) -> Check:
    """build-info.json: every pin of the repository's constraints.txt installed, torch the one LMCache was built on."""
    run = image.run("/bin/cat", "/opt/glm53/build-info.json")
    name = "build-info.json vs constraints.txt"
    command = "cat /opt/glm53/build-info.json"
    try:
        info: dict[str, Any] = json.loads(run.output)
    except json.JSONDecodeError:
        return _check(name, command, run, False, _tail(run.output))
    pins = {}
    for raw in (repo_root / "docker/vllm-lmcache/constraints.txt").read_text().splitlines():
        pin, sep, version = raw.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[re.sub(r"[-_.]+", "-", pin).lower()] = version
    packages: dict[str, str] = info.get("packages", {})
    wrong = [
        f"{pin} {version} != {packages.get(pin)}"
        for pin, version in sorted(pins.items())
        if packages.get(pin) != version
    ]
    facts = {
        "torch built against": info.get("torch_built_against") == info.get("torch"),
        "cuda_image": info.get("cuda_image") == build_args.get("CUDA_RUNTIME_IMAGE"),
        "cuda_devel_image": info.get("cuda_devel_image") == build_args.get("CUDA_DEVEL_IMAGE"),
    }
    bad = wrong + [fact for fact, holds in facts.items() if not holds]
    detail = (
        f"{len(pins)} pins installed as pinned; vllm {info.get('vllm')}, torch {info.get('torch')} (LMCache built "
        f"against {info.get('torch_built_against')}), lmcache {info.get('lmcache')}, "
        f"cuda_image {info.get('cuda_image')}"
        if not bad
        else "; ".join(bad)
    )
    return _check(name, command, run, run.returncode == 0 and not bad, detail)


def _flashinfer_check(image: Image, mode: str) -> Check:
    """What vLLM finds of FlashInfer in the image: the kernels FLASHINFER_KERNELS promised; FlashInfer's CLI runs."""
    run = image.run("/opt/venv/bin/python", "-c", FLASHINFER)
    try:
        found = _json_line(run.output)
    except ProofError as error:
        return _check("FlashInfer as vLLM sees it", "vllm.utils.flashinfer", run, False, str(error))
    expected_cubin = mode == "download"
    dry = image.run(
        "/opt/venv/bin/python",
        "-m",
        "flashinfer",
        "download-kernels",
        "--dry-run",
        "--cuda-version",
        "13.0",
        env={"FLASHINFER_DISABLE_VERSION_CHECK": "1"},
    )
    commands = [line.strip().removeprefix("Command: ") for line in dry.output.splitlines() if "Command:" in line]
    ok = found["has_flashinfer_cubin"] == expected_cubin and dry.returncode == 0 and len(commands) == 2
    detail = (
        f"FLASHINFER_KERNELS={mode}: has_flashinfer {found['has_flashinfer']}, has_flashinfer_cubin "
        f"{found['has_flashinfer_cubin']}, flashinfer-python {found['flashinfer-python']}, flashinfer-cubin "
        f"{found['flashinfer-cubin']}, flashinfer-jit-cache {found['flashinfer-jit-cache']}; the image's "
        f"`python -m flashinfer download-kernels --dry-run` would run: {' ; '.join(commands) or _tail(dry.output, 3)}"
    )
    return Check(
        name="FlashInfer as vLLM sees it",
        command="vllm.utils.flashinfer.has_flashinfer(); python -m flashinfer download-kernels --dry-run",
        passed=ok,
        detail=detail,
        seconds=round(run.seconds + dry.seconds, 1),
    )


def image_facts(image: Image) -> dict[str, Any]:
    """Size, layers (largest first, with the step that made each), labels and ID of the image."""
    info = image.inspect()
    layers = [
        {"bytes": int(entry["Size"]), "created_by": " ".join(str(entry["CreatedBy"]).split())}
        for entry in image.history()
    ]
    return {
        "id": info["Id"],
        "bytes": int(info["Size"]),
        "labels": info["Config"].get("Labels") or {},
        "user": info["Config"].get("User", ""),
        "layers": layers,
    }


def cache_mounts(docker: str) -> list[str]:
    """The build's cache mounts (apt, pip, ccache) and their sizes, as the daemon counts them."""
    done = subprocess.run(
        [docker, "system", "df", "-v", "--format", "{{json .BuildCache}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        entries: list[dict[str, str]] = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        return [f"unreadable: {_tail(done.stdout + done.stderr, 1)}"]
    return [
        f"{e['Description'].split(' from ')[0].removeprefix('cached mount ')} {e['Size']}"
        for e in entries
        if e.get("CacheType") == "exec.cachemount"
    ]


def host_facts(docker: str) -> str:
    """Cores, memory, kernel and the docker client, daemon and storage driver the proof ran with."""
    meminfo = Path("/proc/meminfo").read_text()
    found = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, flags=re.MULTILINE)
    memory = f"{int(found.group(1)) / 2**20:.0f} GiB" if found else "unknown memory"
    version = subprocess.run(
        [docker, "version", "--format", "{{.Client.Version}} / daemon {{.Server.Version}}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    driver = subprocess.run(
        [docker, "info", "--format", "{{.Driver}}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"{os.cpu_count()} cores, {memory}, Linux {os.uname().release}; docker client {version}, {driver}"


def _check_command(args: argparse.Namespace) -> int:
    report = json.loads(args.report.read_text())
    entry = next(e for e in report["images"] if e["image"] == "serving")
    out_dir = args.results / "parse"
    out_dir.mkdir(parents=True, exist_ok=True)
    out_dir.chmod(0o777)  # the image's user (10001) writes the parser's results here
    mounts = [
        f"{args.repo_root.resolve() / UPSTREAM_PARSE}:/proof/upstream_parse.py:ro",
        f"{out_dir.resolve()}:/proof/out",
    ]
    image = Image(args.docker, entry["tags"][0], mounts)
    checks = run_checks(image, args.repo_root, args.chart.read_text(), entry["build_args"], out_dir)
    facts = image_facts(image)
    facts.update(tags=entry["tags"], build_args=entry["build_args"], builder=report["builder"])
    facts["host"] = host_facts(args.docker)
    facts["cache_mounts"] = cache_mounts(args.docker)
    (args.results / "checks.json").write_text(
        json.dumps({"checks": [asdict(c) for c in checks], "image": facts}, indent=2) + "\n"
    )
    for check in checks:
        print(f"{PROG}: {'pass' if check.passed else 'FAIL'} {check.name}: {check.detail}", file=sys.stderr)
    failed = [c.name for c in checks if not c.passed]
    if failed:
        print(f"{PROG}: error: expected every in-image check to pass but {', '.join(failed)} failed; see above.")
        return 1
    return 0


# ---- the record --------------------------------------------------------------------------------------------------

CANNOT_PROVE = """\
- **The real CUDA bases.** nvidia/cuda:13.0.1-devel/runtime-ubuntu24.04 were not pulled (no registry here). Their
  Ubuntu 24.04 packages (python3.12 from Ubuntu, gcc-12, tini 0.19.0, ca-certificates), their library paths,
  environment and CUDA libraries were not exercised: the substitutes are Debian bookworm with the host's CPython 3.12
  under /usr/local (registered with dpkg so `apt-get install python3.12 ...` is a no-op) and the host's CUDA 13.0
  toolkit from NVIDIA's PyPI wheels (nvcc, headers, cudart). The substitute runtime base carries only libcudart.
- **A GPU.** Nothing ran a kernel: `lmcache.cuda_ops` was imported and its symbols resolved against the image's
  torch, but no CUDA call was made; vLLM's parser accepted the engine's command line, but no engine started.
- **FlashInfer's kernels.** flashinfer-cubin and flashinfer-jit-cache at flashinfer-python's version come from
  FlashInfer's own index, which this machine cannot reach (PyPI's newest flashinfer-cubin is older than
  flashinfer-python 0.7.2.post1, and FlashInfer refuses mismatched kernels), so the proof builds with
  `FLASHINFER_KERNELS=none`. The image's FlashInfer CLI was run in dry-run mode to show the install it would make.
- **The pull and the registry.** The image was not pushed or pulled; its size on a registry (compressed) is smaller
  than the unpacked size below.
"""

CI = """\
CI does not build the image: cold, it takes the time above on 2 cores plus the bases, about 45 GB of free disk and
over 4 GB of downloads, so it would take most of CI's run on every commit. Instead every CI run checks the record:
`tests/images/test_image_proof.py` fails, naming the file, when the Dockerfile or a file of docker/vllm-lmcache it
copies differs from the inputs hashed below (so the image cannot change without this proof being run again), and when
the recorded run did not pass every check; `tests/images/test_serving_dockerfile.py` reads the Dockerfile statically
(cache mounts, ARG scope, the base-image label, the Python check before apt, the FlashInfer step)."""

VS_VLLM = """\
vLLM's own image (`vllm/vllm-openai`, built from vLLM's docker/Dockerfile) carries more than ours, on purpose: its
final stage starts from the CUDA *devel* image (nvcc and headers for FlashInfer's and DeepGEMM's JIT) and adds
FlashInfer's cubin and JIT-cache wheels for every architecture, DeepGEMM, gdrcopy, EP kernels (DeepEP, pplx), ffmpeg
and image libraries, accelerate, bitsandbytes, timm, modelscope and a model streamer (vLLM's docker/Dockerfile as
stored at commit dead20ba, a CUDA 12.9 release older than 0.33: its vllm-base and vllm-openai-base stages). Ours
starts from the CUDA *runtime* image and carries vLLM with its declared dependencies, LMCache compiled against its
torch, FlashInfer's precompiled kernels for TORCH_CUDA_ARCH_LIST only, gcc (Triton compiles its launcher stubs at
serve time) and the toolkit. No nvcc: with the kernel wheels installed vLLM needs none
(vllm 0.33.0 vllm/utils/flashinfer.py:88-106). Nothing of the LMCache build stage (nvcc, headers, ninja, ccache, build
dependencies) reaches the runtime image: the wheel comes in through a bind mount."""


def _step(created_by: str) -> str:
    """A layer's step, readable: BuildKit prefixes RUN with every build argument (`RUN |14 A=... /bin/bash -c`)."""
    step = created_by.split("/bin/bash -o pipefail -c ", 1)
    text = ("RUN " + step[1]) if len(step) == 2 else (created_by or "(the base image)")
    text = text.replace("|", "\\|")
    return text if len(text) <= 150 else text[:147] + "..."


def _read(results: Path, name: str, default: str = "") -> str:
    path = results / name
    return path.read_text().strip() if path.exists() else default


def _gb(value: str | int) -> str:
    return f"{int(value) / 1e9:.2f} GB" if str(value).strip() else "n/a"


def _minutes(value: str) -> str:
    if not value:
        return "n/a"
    seconds = int(value)
    return f"{seconds // 60} min {seconds % 60:02d} s ({seconds} s)"


def _revision(report: Path) -> str:
    """The revision a playbook run stamped the image with, from its report (empty when the run kept none)."""
    return str(json.loads(report.read_text()).get("revision", ""))[:12] if report.exists() else ""


def _second_run_row(results: Path, seconds: str) -> tuple[str, str]:
    """The playbook's second run: a full cache hit, or (the revision stamp changed) a rebuild of the runtime stage."""
    before, after = _revision(results / "images-report-cold.json"), _revision(results / "images-report-cached.json")
    if before and after and before != after:
        what = (
            f"**warm build**: the playbook again after a commit landed ({before} to {after}); the runtime stage stamps "
            "the revision, so all of it ran again (apt, venv copy, LMCache wheel, toolkit, build-info) with the "
            "cache mounts; base (vLLM) and build (LMCache compile) stages were cache hits"
        )
        return what, f"**{_minutes(seconds)}**"
    if before and after:
        return "the playbook again right away (same revision: cache hits)", _minutes(seconds)
    return (
        "the playbook again right away (cache hits up to the first step whose inputs changed: a new commit changes the "
        "revision stamp, which reruns the whole runtime stage)",
        _minutes(seconds),
    )


def _run_rows(results: Path, image: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The "This run" table: what was built, with what, how long it took, how big it is."""

    def read(name: str, default: str = "") -> str:
        return _read(results, name, default)

    stamped = ("BUILD_DATE", "IMAGE_VERSION", "VCS_REVISION")  # the playbook's own, from the commit
    build_args = ", ".join(f"`{k}={v}`" for k, v in sorted(image["build_args"].items()) if k not in stamped)
    peak = int(read("peak-data-root-kib", "0")) * 1024
    final = int(read("final-data-root-kib", "0")) * 1024
    bases = f"devel {_gb(read('devel-base-bytes'))}, runtime {_gb(read('runtime-base-bytes'))}"
    return [
        ("date (UTC)", read("date")),
        ("image", f"`{image['tags'][0]}` (`{image['id'][:19]}`), builder {image['builder']}"),
        ("build arguments from the proof", build_args),
        ("host", str(image.get("host", ""))),
        ("CA bundle trusted by the bases (sha256, first 16)", f"`{read('ca-bundle-sha')}`"),
        ("substitute bases made (debootstrap + copies)", f"{_minutes(read('bases-seconds'))}; {bases}"),
        (
            "**cold build** (empty data root, through the playbook)",
            f"**{_minutes(read('cold-seconds'))}**, {_gb(read('cold-rx-bytes'))} received",
        ),
        _second_run_row(results, read("cached-seconds")),
        *(
            [
                (
                    "**warm build** (the playbook, new IMAGE_VERSION: the runtime stage again with the caches)",
                    f"**{_minutes(read('warm-seconds'))}**, {_gb(read('warm-rx-bytes'))} received",
                )
            ]
            if read("warm-seconds")
            else []
        ),
        ("**image size** (unpacked)", f"**{_gb(image['bytes'])}**"),
        ("**peak disk** (daemon data root, sampled every 20 s)", f"**{_gb(peak)}**; {_gb(final)} at the end"),
        ("build cache mounts after the builds", ", ".join(image.get("cache_mounts", [])) or "n/a"),
        ("whole proof", _minutes(read("total-seconds"))),
    ]


def render(repo_root: Path, results: Path) -> str:
    """The Markdown record of one proof run, from its results directory."""
    started_hash = _read(results, "inputs-hash")
    digests = input_digests(repo_root)
    now_hash = inputs_hash(digests)
    if started_hash != now_hash:
        raise ProofError(
            f"expected the inputs the build started from ({started_hash}) but they are now {now_hash}; "
            "an input changed during the run, so run scripts/image-proof.sh again"
        )
    data = json.loads((results / "checks.json").read_text())
    checks = [Check(**c) for c in data["checks"]]
    image = data["image"]
    layers = sorted(image["layers"], key=lambda layer: -layer["bytes"])
    lines = [
        "# The serving image, built on a CPU machine",
        "",
        "<!-- Generated by scripts/image-proof.sh (docker/vllm-lmcache/image_proof.py render) from its run; do not",
        "     edit: run the script again. tests/images/test_image_proof.py fails when the inputs below change. -->",
        "",
        "`scripts/image-proof.sh` makes substitute base images (Debian bookworm + the host's CUDA 13.0 toolkit +",
        "CPython 3.12), starts a private dockerd (overlay2 on disk, Debian's docker.io 20.10 client with",
        "`DOCKER_BUILDKIT=1`, `--network host` for RUN steps), builds the unchanged `docker/vllm-lmcache/Dockerfile`",
        "through `ansible-playbook ansible/build-images.yml` with the bases passed as `CUDA_DEVEL_IMAGE` /",
        "`CUDA_RUNTIME_IMAGE`, checks inside the image, writes this file, and stops its daemon and removes its data",
        "root. Run it as root on a machine with ~45 GB free; `GLM53_PROOF_*` variables (the script's header) change",
        "the defaults.",
        "",
        HASH_LINE.format(now_hash),
        "",
        "## This run",
        "",
        "| what | value |",
        "|---|---|",
        *(f"| {what} | {value} |" for what, value in _run_rows(results, image)),
        "",
        "Received bytes are the host's interfaces' counters over the build (the RUN steps use the host's network), so",
        "they include anything else this shared machine received meanwhile. The builds ran under `nice -n 15`.",
        "Behind this machine's TLS-intercepting proxy pip's HTTP cache stores nothing (`curl -I` of a PyPI file shows",
        "no Cache-Control, ETag or Last-Modified header, only `x-cache-status: BYPASS`), so the pip cache mounts stay",
        "empty here and every build downloads its wheels again; the apt and ccache mounts fill.",
        "",
        "## Checks inside the image",
        "",
        "Each ran with `docker run --rm --network=none --entrypoint ...` as the image's user.",
        "",
        "| check | result | seconds | what it found |",
        "|---|---|---|---|",
    ]
    for check in checks:
        detail = " ".join(ANSI.sub("", check.detail).split()).replace("|", "\\|")
        lines.append(f"| {check.name} | {'pass' if check.passed else '**FAIL**'} | {check.seconds} | {detail} |")
    lines += [
        "",
        "The chart's command lines were rendered with `helm template` from `charts/glm53` (default values) and parsed",
        "by the image's own vLLM and LMCache parsers (`tests/support/upstream_parse.py`, mounted in read-only).",
        "",
        "## Largest layers",
        "",
        "| size | step |",
        "|---|---|",
    ]
    for layer in layers[:10]:
        lines.append(f"| {layer['bytes'] / 1e6:,.0f} MB | `{_step(layer['created_by'])}` |")
    lines += [
        "",
        f"{len(layers)} layers in all; the rest are below {layers[9]['bytes'] / 1e6 if len(layers) > 9 else 0:,.0f} MB"
        " each. The substitute runtime base is the layer with no step.",
        "",
        "## What these substitute bases cannot prove",
        "",
        CANNOT_PROVE,
        "## CI",
        "",
        CI,
        "",
        "## What vLLM's own image carries that ours does not",
        "",
        VS_VLLM,
        "",
        "## Inputs",
        "",
        "The hash above is the sha256 of `sha256sum`'s lines for these files, in this order",
        "(`docker/vllm-lmcache/image_proof.py inputs`):",
        "",
        "| file | sha256 |",
        "|---|---|",
    ]
    lines += [f"| `{path}` | `{digest}` |" for path, digest in digests.items()]
    return "\n".join(lines) + "\n"


def _inputs_command(args: argparse.Namespace) -> int:
    print(inputs_hash(input_digests(args.repo_root)))
    return 0


def _render_command(args: argparse.Namespace) -> int:
    args.output.write_text(render(args.repo_root, args.results))
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line interface: `inputs`, `check`, `render`."""
    parser = argparse.ArgumentParser(prog=PROG, description="The serving image's proof: inputs, checks, record.")
    commands = parser.add_subparsers(dest="command", required=True)
    inputs = commands.add_parser("inputs", help="print the inputs hash")
    inputs.add_argument("--repo-root", type=Path, required=True)
    inputs.set_defaults(func=_inputs_command)
    check = commands.add_parser("check", help="run the in-image checks, write RESULTS/checks.json")
    check.add_argument("--repo-root", type=Path, required=True)
    check.add_argument("--docker", default="docker", help="the docker CLI (DOCKER_HOST names the daemon)")
    check.add_argument("--report", type=Path, required=True, help="the playbook's build report (JSON)")
    check.add_argument("--chart", type=Path, required=True, help="`helm template` output of charts/glm53")
    check.add_argument("--results", type=Path, required=True)
    check.set_defaults(func=_check_command)
    record = commands.add_parser("render", help="write the Markdown record of a run")
    record.add_argument("--repo-root", type=Path, required=True)
    record.add_argument("--results", type=Path, required=True)
    record.add_argument("--output", type=Path, required=True)
    record.set_defaults(func=_render_command)
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Run one subcommand; exit 1 with one line on a missing or unreadable result."""
    args = parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except (ProofError, OSError, KeyError, json.JSONDecodeError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
