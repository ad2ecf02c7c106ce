"""`scripts/gpu-proof.sh --dry-run` and the arithmetic of `benchmarks/gpu_proof.py`, on a CPU machine.

The GPU proof itself needs an H200 (see docs/operations.md, "What is verified where"); CI checks what can rot without
one: the script's argument handling and input checks, the plan it prints, the geometry and byte counts the speed
numbers are divided by, that the server it starts has the chart's sidecar flags, and (slow) the engine stand-in's
store/lookup/retrieve flow against the real `lmcache server` on CPU, which LMCache moves through POSIX SHM instead of
CUDA IPC.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from glm53 import chart
from glm53.podplan import deployment_pod

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-proof.sh"


def load_gpu_proof() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_proof", REPO / "benchmarks" / "gpu_proof.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_proof"] = module
    spec.loader.exec_module(module)
    return module


gp = load_gpu_proof()


@pytest.fixture
def carry(tmp_path: Path) -> Path:
    """A carry folder with the names the script checks (contents are never read by a dry run)."""
    for name in ("sdist/lmcache-0.5.6.tar.gz", "wheels/numpy-2.2.6-cp312-cp312-x.whl", "rt/pyzmq-27.3.0-cp312-x.whl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--python", sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dry_run_prints_every_stage_and_the_cases(carry: Path) -> None:
    result = dry_run("--carry", str(carry), "--out", "/nonexistent/out")
    assert result.returncode == 0, result.stderr
    stages = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ") and "@" not in line]
    assert stages == ["machine", "build", "deps", "install", "kernels", "ipc", "probe", "lmcache-tests"]
    assert "--arch-list 9.0" in result.stdout
    # The per-worker sizes the GB/s figures rest on: GLM-5.3-Flash's five cacheable groups, GLM-5.3's 78 x (576 + 132).
    assert "glm53-flash@1152: 57 tensors in 6 groups" in result.stdout
    assert "46,443 B/token" in result.stdout
    assert "glm53@256: 156 tensors in 1 groups (dsa_mla[64]); 100,152 B/token" in result.stdout
    assert not Path("/nonexistent/out").exists()


def test_dry_run_with_a_built_wheel_skips_the_build(carry: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "lmcache-0.5.6-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"")
    result = dry_run("--carry", str(carry), "--lmcache-wheel", str(wheel), "--stages", "deps,install,ipc")
    assert result.returncode == 0, result.stderr
    assert "build-lmcache.sh" not in result.stdout
    assert str(wheel) in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--stages", "build,fly"), "unknown stage 'fly'"),
        (("--max-jobs", "0"), "expected --max-jobs to be a positive integer but got '0'"),
        (("--time-budget", "soon"), "expected --time-budget to be a positive integer but got 'soon'"),
        (("--lmcache-wheel", "/nonexistent.whl"), "expected the LMCache wheel /nonexistent.whl but it does not exist"),
        (("--case", "glm53-flash@256"), "chunk size 256 is not a multiple of GLM-5.3-Flash's block size 1152"),
        (("--case", "glm53"), "expected a case like glm53@256 (PROFILE@CHUNK_SIZE) but got 'glm53'"),
        (("--chunks", "40"), "raise it or lower --chunks/--reps"),
        (("--carry",), "expected a value after --carry"),
        (("--bogus",), "unknown argument '--bogus'"),
    ],
)
def test_bad_arguments_fail_with_one_line(carry: Path, args: tuple[str, ...], message: str) -> None:
    result = dry_run("--carry", str(carry), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("sdist/lmcache-0.5.6.tar.gz", "expected the LMCache sdist at"),
        ("wheels/numpy-2.2.6-cp312-cp312-x.whl", "expected the build's wheels in"),
        ("rt/pyzmq-27.3.0-cp312-x.whl", "expected LMCache's runtime wheels in"),
    ],
)
def test_missing_carried_inputs_are_named(carry: Path, missing: str, message: str) -> None:
    (carry / missing).unlink()
    result = dry_run("--carry", str(carry))
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize("name", gp.DEFAULT_CASES)
def test_the_proofs_server_runs_the_charts_sidecar_flags(name: str) -> None:
    """The GPU host has no helm-python-sdk, so gpu_proof spells the sidecar's flags itself: they must be what the chart
    renders for the same install (GPU mode), ports and L1 size aside; its environment only adds the banner switch."""
    case = gp.parse_case(name)
    lmcache = {"chunkSize": case.chunk_size, "separateObjectGroups": case.separate_object_groups}
    sidecar = deployment_pod(chart.render({"profile": case.profile, "lmcache": lmcache})).container("lmcache")
    built = gp.server_argv(
        ("lmcache", "server"),
        case,
        port=int(sidecar.option("--port")),
        http_port=int(sidecar.option("--http-port")),
        l1_size_gb=float(sidecar.option("--l1-size-gb")),
        shm_name=None,
    )
    assert tuple(built) == sidecar.served_argv
    assert set(gp.SERVER_ENV.items()) - set(sidecar.env) == {("LMCACHE_DISABLE_BANNER", "1")}


def test_flash_groups_follow_the_profile_table() -> None:
    case = gp.make_case("glm53-flash", 1152)
    assert [g.tokens_per_block for g in case.groups] == [1152] * 6
    assert [g.spec for g in case.groups] == ["mamba"] * 4 + ["mla", "scratch"]
    # 34 KDA layers over the four state groups, 11 sparse-MLA layers with their compressed indexer (288 slots).
    assert [g.planes[0].count for g in case.groups[:4]] == [9, 9, 8, 8]
    assert [(p.count, p.slots_per_block) for p in case.groups[4].planes] == [(11, 1152), (11, 288)]
    assert case.bytes_per_token == pytest.approx(34 * 1024 + 11 * (1024 + 132 / 4))


def test_bytes_moved_counts_one_state_block_per_kda_group() -> None:
    case = gp.make_case("glm53-flash", 1152)
    windows = gp.expected_windows(case)
    assert gp.restored_blocks(case, 8, windows) == [1, 1, 1, 1, 8, 0]
    kda_block = 1152 * 1024
    assert gp.bytes_moved(case, 8, windows) == 34 * kda_block + 8 * 1152 * 11 * (1024 + 132 / 4)
    glm53 = gp.make_case("glm53", 256)
    assert gp.bytes_moved(glm53, 8, gp.expected_windows(glm53)) == 8 * 256 * 78 * (1152 + 132)


def test_block_ids_skip_the_null_block_and_follow_lmcache_groups() -> None:
    case = gp.make_case("glm53", 256)
    settings = gp.Settings((case,), chunks=2, reps=1, warmup=0, l1_size_gb=1, device="cpu")
    assert gp.engine_block_ids(case, settings, destination=False) == [list(range(1, 9))]
    assert gp.engine_block_ids(case, settings, destination=True) == [list(range(9, 17))]

    class Info:
        def __init__(self, engine_group_id: int) -> None:
            self.engine_group_id = engine_group_id

    # GLM-5.3's one vLLM group is two LMCache groups (latent, indexer): one block-id list each.
    assert gp.block_ids(case, settings, False, [Info(0), Info(0)]) == [list(range(1, 9))] * 2


def test_ipc_table_prints_ratios_to_the_same_size_memcpy() -> None:
    report = {
        "cases": [
            {
                "case": "glm53@256",
                "bytes_per_token": 100152.0,
                "bytes_per_request_moved": 205111296,
                "all_hit": True,
                "all_equal": True,
                "store_gbps": 27.5,
                "retrieve_gbps": 44.0,
            },
            {"case": "glm53@1152", "error": "ProofError: boom"},
        ],
        "pinned_memcpy": [{"bytes": 205111296, "d2h_gbps": 55.0, "h2d_gbps": 55.0}],
    }
    table = "\n".join(gp.ipc_table(report))
    assert "27.50 ( 50%)" in table
    assert "44.00 ( 80%)" in table
    assert "glm53@1152           ERROR ProofError: boom" in table


@pytest.mark.slow
def test_cpu_rehearsal_stores_looks_up_and_retrieves_through_the_real_server(tmp_path: Path) -> None:
    """The whole stand-in flow on CPU: the hybrid geometry, its window rule and the byte comparison."""
    pytest.importorskip("lmcache")
    args = ["ipc", "--device", "cpu", "--case", "glm53-flash@1152", "--chunks", "2", "--reps", "1", "--warmup", "0"]
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_proof.py"), *args, "--l1-size-gb", "1", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    case = json.loads((tmp_path / "ipc.json").read_text())["cases"][0]
    assert case["all_hit"] and case["all_equal"]
    groups = case["rounds"][0]["groups"]
    # KDA state: only the last of the 2 chunks comes back, the other block keeps its poison; MLA: every block.
    assert groups["0:kda_state"] == {**groups["0:kda_state"], "blocks": 18, "equal": 9, "untouched": 9, "ok": 18}
    assert groups["4:sparse_mla_indexer"]["equal"] == groups["4:sparse_mla_indexer"]["blocks"] == 44
    assert (tmp_path / "lmcache-server-glm53-flash-1152.log").is_file()
