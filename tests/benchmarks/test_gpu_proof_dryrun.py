"""`scripts/gpu-proof.sh --dry-run` and the arithmetic of `benchmarks/gpu_proof`, on a CPU machine.

The GPU proof itself needs an H200 (see docs/operations.md, "What is verified where", and docs/gpu-transfer.md); CI
checks what can rot without one: the script's argument handling and input checks, the plan it prints, vLLM's
align-mode block ids and the byte counts the speed numbers are divided by, the phase and percentile arithmetic, the
TP ranks' roles as LMCache's connector assigns them, that the server it starts has the chart's sidecar flags, and
(slow) the engine stand-in's store/lookup/retrieve flow against the real `lmcache server` on CPU, one worker and two
TP ranks, which LMCache moves through POSIX SHM instead of CUDA IPC.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_proof import ProofError, engine, geometry, plan, report, server, stats

from glm53.pod import chart
from glm53.pod.plan import deployment_pod

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-proof.sh"
CARRY_SCRIPT = REPO / "scripts" / "gpu-proof-carry.sh"
PROOF = REPO / "benchmarks" / "gpu_proof"


@pytest.fixture
def carry(tmp_path: Path) -> Path:
    """A carry folder with the names the script checks (contents are never read by a dry run)."""
    for name in ("sdist/lmcache-0.5.6.tar.gz", "wheels/numpy-2.2.6-cp312-cp312-x.whl", "rt/pyzmq-27.3.0-cp312-x.whl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def run_command(argv: list[str], cwd: Path = REPO, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end (within `timeout` seconds), its exit status and text output captured."""
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_command(["bash", str(SCRIPT), "--dry-run", "--python", sys.executable, *args])


def carry_script(*args: str) -> subprocess.CompletedProcess[str]:
    """`scripts/gpu-proof-carry.sh` with this interpreter as its Python (a later --python in `args` wins)."""
    return run_command(["bash", str(CARRY_SCRIPT), "--python", sys.executable, *args])


def test_dry_run_prints_every_stage_and_the_cases(carry: Path) -> None:
    result = dry_run("--carry", str(carry), "--out", "/nonexistent/out")
    assert result.returncode == 0, result.stderr
    stages = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ") and "@" not in line]
    assert stages == ["machine", "build", "deps", "install", "kernels", "ipc", "tp", "probe", "lmcache-tests"]
    assert "--arch-list 9.0" in result.stdout
    # The per-worker sizes the GB/s figures rest on: GLM-5.3-Flash's five cacheable groups, GLM-5.3's 78 x (576 + 132).
    assert "glm53-flash@1152: 57 tensors in 6 groups" in result.stdout
    assert "46,443 B/token" in result.stdout
    assert "glm53@256: 156 tensors in 1 groups (dsa_mla[64]); 100,152 B/token" in result.stdout
    # vLLM's align-mode ids: the same bytes each way (140.4 MiB at 8 chunks); the old all-real ids stored 408.2 MiB.
    assert "8: 140.4/140.4" in result.stdout
    assert "8 all-real: 408.2/140.4" in result.stdout
    # The TP runs: GLM-5.3 is pure MLA, so one rank stores for the pod's server; Flash's every rank stores.
    assert "tp glm53@256 x8 single-GPU, 1 server (one)" in result.stdout
    assert "1 writing" in result.stdout
    assert "tp glm53-flash@1152 x4 single-GPU, 1 server (one)" in result.stdout
    assert not Path("/nonexistent/out").exists()


def test_dry_run_with_a_built_wheel_skips_the_build(carry: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "lmcache-0.5.6-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"")
    result = dry_run("--carry", str(carry), "--lmcache-wheel", str(wheel), "--stages", "deps,install,ipc")
    assert result.returncode == 0, result.stderr
    assert "build-lmcache.sh" not in result.stdout
    assert str(wheel) in result.stdout


def test_dry_run_builds_the_sdist_of_the_lmcache_version_asked_for(carry: Path) -> None:
    """A pre-release (0.5.7rc2) is proven from its own sdist before the image moves; 0.5.6 stays the default."""
    (carry / "sdist" / "lmcache-0.5.7rc2.tar.gz").write_bytes(b"")
    result = dry_run("--carry", str(carry), "--lmcache-version", "0.5.7rc2", "--stages", "build,lmcache-tests")
    assert result.returncode == 0, result.stderr
    assert f"build-lmcache.sh --source {carry}/sdist/lmcache-0.5.7rc2.tar.gz --arch-list 9.0" in result.stdout
    assert "lmcache-0.5.6" not in result.stdout
    default = dry_run("--carry", str(carry), "--stages", "build")
    assert default.returncode == 0, default.stderr
    assert f"--source {carry}/sdist/lmcache-0.5.6.tar.gz" in default.stdout


def test_a_version_without_its_sdist_names_the_missing_file(carry: Path) -> None:
    result = dry_run("--carry", str(carry), "--lmcache-version", "0.5.7rc2", "--stages", "build")
    assert result.returncode == 2
    assert f"expected the LMCache sdist at {carry}/sdist/lmcache-0.5.7rc2.tar.gz but it is missing" in result.stderr


def test_the_carry_script_keeps_the_sdists_versioned_name(tmp_path: Path) -> None:
    """gpu-proof.sh finds the sdist by version, so a renamed one is refused before anything is downloaded."""
    sdist = tmp_path / "lmcache.tar.gz"
    sdist.write_bytes(b"")
    result = carry_script("--sdist", str(sdist), "--carry", str(tmp_path / "carry"))
    assert result.returncode == 2
    assert "expected --sdist to be named like lmcache-0.5.6.tar.gz but got 'lmcache.tar.gz'" in result.stderr
    assert not (tmp_path / "carry").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--python", "/nonexistent/python3"), "expected a Python with pip at '/nonexistent/python3'"),
        (("--wheel", "/nonexistent/lmcache-0.5.6-cp312-cp312-linux_x86_64.whl"), "(run 1's --out folder holds it)"),
        (("--wheel", "WHEEL", "--sdist", "SDIST"), "expected --sdist or --wheel, not both"),
        (("--lmcache-version", "latest"), "expected --lmcache-version like 0.5.6 or 0.5.7rc2 but got 'latest'"),
    ],
)
def test_the_carry_script_refuses_what_it_cannot_use_in_one_line(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """Checked before the carry folder is emptied or anything is downloaded."""
    wheel = tmp_path / "lmcache-0.5.6-cp312-cp312-linux_x86_64.whl"
    sdist = tmp_path / "lmcache-0.5.6.tar.gz"
    wheel.write_bytes(b"")
    sdist.write_bytes(b"")
    named = [str(wheel) if a == "WHEEL" else str(sdist) if a == "SDIST" else a for a in args]
    result = carry_script("--carry", str(tmp_path / "c"), *named)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_the_proof_runs_from_its_folder_with_a_bare_python(tmp_path: Path) -> None:
    """The GPU host runs `python3 benchmarks/gpu_proof` outside any venv: no site-packages, any working directory."""
    result = run_command(
        [sys.executable, "-I", "-S", str(PROOF), "plan", "--case", "glm53@256:1", "--tp-case", "glm53@256"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "glm53@256:1: 156 tensors in 1 groups" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--stages", "build,fly"), "unknown stage 'fly'"),
        (("--lmcache-version", "latest"), "expected --lmcache-version like 0.5.6 or 0.5.7rc2 but got 'latest'"),
        (("--lmcache-version", "0.5.6/../x"), "expected --lmcache-version like 0.5.6 or 0.5.7rc2 but got '0.5.6/../x'"),
        (("--max-jobs", "0"), "expected --max-jobs to be a positive integer but got '0'"),
        (("--time-budget", "soon"), "expected --time-budget to be a positive integer but got 'soon'"),
        (("--lmcache-wheel", "/nonexistent.whl"), "expected the LMCache wheel /nonexistent.whl but it does not exist"),
        (("--case", "glm53-flash@256"), "chunk size 256 is not a multiple of GLM-5.3-Flash's block size 1152"),
        (("--case", "glm53"), "expected a case like glm53@256 (PROFILE@CHUNK_SIZE, optionally :CHUNKS"),
        (("--case", "glm53@256:0"), "expected a case's chunk counts as positive integers"),
        (("--l1-size-gb", "1", "--chunks", "40"), "raise it or lower --chunks/--reps"),
        (("--chunks", "64,128"), "more than the 20 GB a server pins at start"),
        (("--tp-chunks", "64"), "per server, more than the 20 GB a server pins at start"),
        (("--layouts", "one,shared"), "expected --layouts from one, per-rank but got 'shared'"),
        (("--ranks", "4,x"), "expected --ranks as positive integers"),
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


@pytest.mark.parametrize("name", plan.DEFAULT_CASES)
def test_the_proofs_server_runs_the_charts_sidecar_flags(name: str) -> None:
    """The GPU host has no helm-python-sdk, so gpu_proof spells the sidecar's flags itself: they must be what the chart
    renders for the same install (GPU mode), ports and L1 size aside; its environment only adds the banner switch."""
    case = geometry.parse_case(name)
    lmcache = {"chunkSize": case.chunk_size, "separateObjectGroups": case.separate_object_groups}
    sidecar = deployment_pod(chart.render({"profile": case.profile, "lmcache": lmcache})).container("lmcache")
    built = server.server_argv(
        ("lmcache", "server"),
        case,
        port=int(sidecar.option("--port")),
        http_port=int(sidecar.option("--http-port")),
        l1_size_gb=float(sidecar.option("--l1-size-gb")),
        shm_name=None,
        l2_dir=Path(json.loads(sidecar.option("--l2-adapter"))["base_path"]),
    )
    assert tuple(built) == sidecar.served_argv
    assert set(server.SERVER_ENV.items()) - set(sidecar.env) == {("LMCACHE_DISABLE_BANNER", "1")}


def test_flash_groups_follow_the_profile_table() -> None:
    case = geometry.make_case("glm53-flash", 1152)
    assert [g.tokens_per_block for g in case.groups] == [1152] * 6
    assert [g.spec for g in case.groups] == ["mamba"] * 4 + ["mla", "scratch"]
    # 34 KDA layers over the four state groups, 11 sparse-MLA layers with their compressed indexer (288 slots).
    assert [g.planes[0].count for g in case.groups[:4]] == [9, 9, 8, 8]
    assert [(p.count, p.slots_per_block) for p in case.groups[4].planes] == [(11, 1152), (11, 288)]
    assert case.bytes_per_token == pytest.approx(34 * 1024 + 11 * (1024 + 132 / 4))


def test_bytes_moved_counts_one_state_block_per_kda_group() -> None:
    case = geometry.make_case("glm53-flash", 1152)
    windows = geometry.expected_windows(case)
    assert geometry.restored_blocks(case, 8, windows) == [1, 1, 1, 1, 8, 0]
    kda_block = 1152 * 1024
    assert geometry.bytes_moved(case, 8, windows) == 34 * kda_block + 8 * 1152 * 11 * (1024 + 132 / 4)
    glm53 = geometry.make_case("glm53", 256)
    assert geometry.bytes_moved(glm53, 8, geometry.expected_windows(glm53)) == 8 * 256 * 78 * (1152 + 132)


def test_align_ids_store_what_a_retrieve_restores_and_all_real_ids_store_three_times_that() -> None:
    """The issue's 147 MB and 428 MB: an 8-chunk Flash store with vLLM's ids and with the old benchmark's."""
    case = geometry.make_case("glm53-flash", 1152)
    stored, restored = geometry.request_bytes(case, 8, "align")
    assert stored == restored == 147_262_464
    old_stored, old_restored = geometry.request_bytes(case, 8, "all-real")
    assert (old_stored, old_restored) == (147_262_464 + 34 * 7 * 1152 * 1024, 147_262_464)
    assert round(old_stored / 1e6) == 428
    # GLM-5.3 has no KDA groups: both layouts are the same request.
    glm53 = geometry.make_case("glm53", 256)
    assert geometry.request_bytes(glm53, 8, "align") == geometry.request_bytes(glm53, 8, "all-real")


def test_align_ids_give_kda_groups_the_null_block_but_for_the_last() -> None:
    case = geometry.make_case("glm53-flash", 1152)
    src = geometry.engine_block_ids(case, 4, destination=False, layout="align")
    dst = geometry.engine_block_ids(case, 4, destination=True, layout="align")
    assert src[:4] == [[0, 0, 0, 4]] * 4 and dst[:4] == [[0, 0, 0, 8]] * 4
    assert src[4] == [1, 2, 3, 4] and dst[4] == [5, 6, 7, 8]
    assert src[5] == dst[5] == []  # the scratch group takes part in no transfer
    assert geometry.engine_block_ids(case, 4, destination=False, layout="all-real")[0] == [1, 2, 3, 4]
    with pytest.raises(ProofError, match="expected a block-id layout in align, all-real but got 'sparse'"):
        geometry.engine_block_ids(case, 4, destination=False, layout="sparse")


def test_block_ids_skip_the_null_block_and_follow_lmcache_groups() -> None:
    case = geometry.make_case("glm53", 256)
    assert geometry.engine_block_ids(case, 2, destination=False) == [list(range(1, 9))]
    assert geometry.engine_block_ids(case, 2, destination=True) == [list(range(9, 17))]

    class Info:
        def __init__(self, engine_group_id: int) -> None:
            self.engine_group_id = engine_group_id

    # GLM-5.3's one vLLM group is two LMCache groups (latent, indexer): one block-id list each.
    assert geometry.block_ids(case, 2, False, "align", [Info(0), Info(0)]) == [list(range(1, 9))] * 2


def test_the_sweep_sizes_l1_for_every_request_it_stores() -> None:
    case = geometry.parse_case("glm53-flash@1152:1,8")
    assert case.chunk_counts == (1, 8) and case.label == "glm53-flash@1152"
    settings = plan.Settings((case,), chunks=(4,), reps=2, warmup=1, l1_size_gb=None, device="cpu", all_real_at=8)
    assert settings.points(case) == [(1, "align"), (8, "align"), (8, "all-real")]
    stored = sum(geometry.request_bytes(case, c, layout)[0] for c, layout in settings.points(case))
    assert settings.l1_needed_gb(case) == pytest.approx(stored * 3 * 1.25 / 2**30)
    assert settings.l1_for(case) == math.ceil(settings.l1_needed_gb(case) + 0.5)


def test_phases_split_one_request_at_the_servers_timestamps() -> None:
    ms = 1_000_000
    record = {
        "enter_ns": 2 * ms,
        "first_transfer_ns": 5 * ms,
        "last_transfer_ns": 6 * ms,
        "exit_ns": 7 * ms,
        "copy_done_ns": 9 * ms,
        "copy_s": 0.004,
        "bytes": 147_262_464,
        "transfers": 5,
    }
    phases = stats.join_phases(1 * ms, 10 * ms, record)
    assert phases["total_s"] == pytest.approx(0.009)
    assert phases["transport_in_s"] == pytest.approx(0.001)
    assert phases["pre_copy_s"] == pytest.approx(0.003)
    assert phases["post_copy_s"] == pytest.approx(0.001)
    assert phases["reply_s"] == pytest.approx(0.001)  # from the copy's end, which came after the handler's
    assert phases["client_transport_s"] == pytest.approx(0.002)
    assert phases["server_bytes"] == 147_262_464
    assert stats.join_phases(1 * ms, 10 * ms, None) == {"total_s": pytest.approx(0.009)}


def test_percentiles_and_aggregate_rates() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert stats.percentile(samples, 50) == 50.0
    assert stats.percentile(samples, 99) == 99.0
    assert stats.percentile([3.0, 1.0, 2.0], 99) == 3.0
    # Two copies of 1 GB, overlapping: 2 GB over the 0.5 s from the first start to the last end.
    spans = [(0, 400_000_000, 10**9), (100_000_000, 500_000_000, 10**9)]
    assert stats.aggregate_gbps(spans) == pytest.approx(4.0)
    assert stats.aggregate_gbps([]) == 0.0


def test_tp_roles_follow_lmcaches_parallel_strategy() -> None:
    """GLM-5.3 is pure MLA: KV replicated, so rank 0 stores for the pod's server and all ranks read it; per rank, every
    rank stores to its own server. Flash is hybrid: every rank stores its own shard (key world size = TP size)."""
    pytest.importorskip("lmcache")
    glm53 = geometry.make_case("glm53", 256)
    one = engine.tp_roles(glm53, 8, "one")
    assert [r.writer for r in one] == [True] + [False] * 7
    assert {(r.kv_world_size, r.kv_worker_id, r.num_kv_readers, r.server) for r in one} == {(1, 0, 8, 0)}
    per_rank = engine.tp_roles(glm53, 8, "per-rank")
    assert all(r.writer for r in per_rank) and [r.server for r in per_rank] == list(range(8))
    assert {(r.kv_world_size, r.num_kv_readers) for r in per_rank} == {(1, 1)}
    flash = engine.tp_roles(geometry.make_case("glm53-flash", 1152), 4, "one")
    assert [(r.writer, r.kv_world_size, r.kv_worker_id, r.num_kv_readers) for r in flash] == [
        (True, 4, rank, 1) for rank in range(4)
    ]
    assert not any(r.replicated for r in flash) and all(r.replicated for r in one)
    tp = plan.TpSettings((glm53,), ranks=(8,), layouts=("one",), chunks=8, reps=1, warmup=0, device="cpu")
    assert tp.writers(glm53, 8, "one") == sum(r.writer for r in one)
    assert tp.writers(glm53, 8, "per-rank") == sum(r.writer for r in per_rank)


def test_ipc_table_prints_ratios_to_the_same_size_memcpy() -> None:
    row = {"total_s": 0.00745, "transport_in_s": 0.0002, "pre_copy_s": 0.0035, "copy_s": 0.0035, "gbps": 27.5}
    ipc_report = {
        "cases": [
            {
                "case": "glm53@256",
                "points": [
                    {
                        "chunks": 8,
                        "layout": "align",
                        "bytes_stored_planned": 205111296,
                        "bytes_restored_planned": 205111296,
                        "all_hit": True,
                        "all_equal": True,
                        "bytes_match_plan": True,
                        "null_block_untouched": True,
                        "visible_after_s": 0.004,
                        "store": row,
                        "retrieve": {**row, "gbps": 44.0},
                    }
                ],
            },
            {"case": "glm53@1152", "error": "ProofError: boom"},
        ],
        "pinned_memcpy": [{"bytes": 205111296, "d2h_gbps": 55.0, "h2d_gbps": 55.0}],
    }
    table = "\n".join(report.ipc_table(ipc_report))
    assert "27.50 ( 50%)" in table
    assert "44.00 ( 80%)" in table
    assert "glm53@1152        ERROR ProofError: boom" in table
    assert "glm53@256 x8" in table and "3.50" in table  # the phase table: pre-copy and copy in ms


def rehearse(tmp_path: Path, command: str, *args: str) -> dict[str, Any]:
    """`benchmarks/gpu_proof COMMAND ARGS` on CPU against the real `lmcache server` (skipped without LMCache): it must
    succeed; its JSON report (`COMMAND.json` in `tmp_path`, beside the server logs)."""
    pytest.importorskip("lmcache")
    result = run_command(
        [sys.executable, str(PROOF), command, *args, "--device", "cpu", "--out", str(tmp_path)], timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written: dict[str, Any] = json.loads((tmp_path / f"{command}.json").read_text())
    return written


@pytest.mark.slow
def test_cpu_rehearsal_stores_looks_up_and_retrieves_through_the_real_server(tmp_path: Path) -> None:
    """The whole stand-in flow on CPU: the hybrid geometry, vLLM's align-mode ids, the bytes the server copied."""
    args = ["--case", "glm53-flash@1152", "--chunks", "2", "--reps", "1", "--warmup", "0", "--all-real-at", "2"]
    case = rehearse(tmp_path, "ipc", *args)["cases"][0]
    align, all_real = case["points"]
    assert align["all_hit"] and align["all_equal"] and align["null_block_untouched"] and align["bytes_match_plan"]
    # The server copied what the plan counts: with vLLM's ids one state block per KDA layer each way; with all-real
    # ids the store copied both chunks' state blocks and the retrieve still restored one.
    assert align["store"]["server_bytes"] == align["retrieve"]["server_bytes"] == [66_896_640]
    assert all_real["store"]["server_bytes"] == [66_896_640 + 34 * 1152 * 1024]
    assert all_real["retrieve"]["server_bytes"] == [66_896_640]
    groups = case["rounds"][0]["retrieve"]["groups"]
    # KDA state: only the last of the 2 chunks has a real block, and it comes back; MLA: every block.
    assert groups["0:kda_state"] == {**groups["0:kda_state"], "blocks": 9, "equal": 9, "ok": 9}
    assert groups["4:sparse_mla_indexer"]["equal"] == groups["4:sparse_mla_indexer"]["blocks"] == 44
    assert align["store"]["pre_copy_s"] > 0 and align["store"]["copy_s"] > 0
    assert (tmp_path / "lmcache-server-glm53-flash-1152.log").is_file()


@pytest.mark.slow
def test_cpu_rehearsal_of_two_tp_ranks_on_the_pods_server(tmp_path: Path) -> None:
    """Two rank processes, GLM-5.3 (pure MLA: rank 0 stores, both read the one copy), byte-equal on both ranks."""
    args = ["--tp-case", "glm53@256", "--ranks", "2", "--tp-chunks", "1", "--tp-reps", "1", "--warmup", "0"]
    run = rehearse(tmp_path, "tp", *args)["runs"][0]
    assert run["writers"] == 1 and run["servers"] == 1
    assert run["all_hit"] and run["all_equal"] and run["null_block_untouched"]
    assert run["store"]["samples"] == 1 and run["retrieve"]["samples"] == 2
    assert run["retrieve"]["server_bytes"] == [run["bytes_restored_per_rank"]]
    assert run["server_cpu_cores"] > 0
