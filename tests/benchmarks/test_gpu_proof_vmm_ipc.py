"""The pure parts of `benchmarks/gpu_proof vmm-files` / `vmm-ipc` on CPU: extracting vLLM 0.34's two VMM files from
its wheel with stubs, recording a step's outcome, the table, and the conclusion drawn from each combination of
outcomes. The GPU half runs on a lent H200 (docs/gpu-transfer.md)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from gpu_proof import ProofError, vmm_ipc

REPO = Path(__file__).resolve().parents[2]
PROOF = REPO / "benchmarks" / "gpu_proof"


def make_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_extract_writes_upstream_verbatim_and_stubs(tmp_path: Path) -> None:
    upstream = {f: f"# upstream {f}\nVALUE = {i}\n" for i, f in enumerate(vmm_ipc.UPSTREAM_FILES)}
    wheel = make_wheel(tmp_path / "vllm.whl", {**upstream, "vllm/utils/__init__.py": "import heavy_stuff\n"})
    written = vmm_ipc.extract_upstream(wheel, tmp_path / "pkg")
    assert {p.relative_to(tmp_path / "pkg").as_posix() for p in written} == set(upstream) | set(vmm_ipc.STUBS)
    for name, text in upstream.items():
        assert (tmp_path / "pkg" / name).read_text() == text
    # the wheel's own vllm/utils/__init__.py (which imports the rest of vLLM) is replaced by an empty stub
    assert (tmp_path / "pkg" / "vllm/utils/__init__.py").read_text() == ""


def test_logger_stub_provides_init_logger_with_warning_once(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "vllm.whl", {f: "" for f in vmm_ipc.UPSTREAM_FILES})
    vmm_ipc.extract_upstream(wheel, tmp_path / "pkg")
    code = "from vllm.logger import init_logger; log = init_logger('x'); log.warning_once('hi %s', 1); print('ok')"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "pkg", capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "ok"
    assert "hi 1" in result.stderr


def test_extract_rejects_a_wheel_without_the_files(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "vllm.whl", {vmm_ipc.UPSTREAM_FILES[0]: ""})
    with pytest.raises(ProofError, match=r"extensible_tensor\.py"):
        vmm_ipc.extract_upstream(wheel, tmp_path / "pkg")
    (tmp_path / "bad.whl").write_text("not a zip")
    with pytest.raises(ProofError, match=r"bad\.whl"):
        vmm_ipc.extract_upstream(tmp_path / "bad.whl", tmp_path / "pkg")


def test_outcome_records_value_or_error_verbatim() -> None:
    step, value = vmm_ipc.outcome(lambda: {"equal": True, "bytes": 4})
    assert step == {"ok": True, "result": {"equal": True, "bytes": 4}} and value == {"equal": True, "bytes": 4}

    def fail() -> None:
        raise RuntimeError("cudaIpcGetMemHandle failed: cudaError_t.cudaErrorInvalidValue")

    step, value = vmm_ipc.outcome(fail)
    assert step == {"ok": False, "error": "RuntimeError: cudaIpcGetMemHandle failed: cudaError_t.cudaErrorInvalidValue"}
    assert value is None
    long = vmm_ipc.describe_error(ValueError("x" * 5000))
    assert len(long) == vmm_ipc.ERROR_CHARS and long.endswith("...")
    assert vmm_ipc.summarize((b"abc", object())) == ["<3 bytes>", "object"]


OK_IMPORT = {"ok": True, "result": {"equal": True, "bytes": 8}}
FAILED = {"ok": False, "error": "RuntimeError: boom"}


def make_report(shared: dict[tuple[str, str], bool]) -> dict[str, Any]:
    allocations: dict[str, Any] = {}
    for alloc in vmm_ipc.ALLOCATIONS:
        wrappers: dict[str, dict[str, Any]] = {}
        for w in vmm_ipc.WRAPPERS:
            if shared.get((alloc, w)):
                wrappers[w] = {"export": {"ok": True, "result": "90-byte descriptor"}, "import": OK_IMPORT}
            else:
                wrappers[w] = {"export": FAILED, "import": None}
        allocations[alloc] = {"allocate": {"ok": True, "result": "tuple"}, "driver": {}, "wrappers": wrappers}
    return {"allocations": allocations}


def test_conclusion_confirmed_with_and_without_the_vmm_wrapper() -> None:
    report = make_report({("control", "CudaIPCWrapper"): True})
    text = vmm_ipc.conclusion(report)
    assert text.startswith("confirmed:") and "--no-enable-extensible-kv-cache" in text and "vmm-fd" not in text
    report = make_report({("control", "CudaIPCWrapper"): True, ("vmm-fd", "VmmCudaIPCWrapper"): True})
    assert "only VmmCudaIPCWrapper shares it" in vmm_ipc.conclusion(report)


def test_conclusion_refuted_and_inconclusive() -> None:
    report = make_report({("control", "CudaIPCWrapper"): True, ("vmm", "RawCudaIPCWrapper"): True})
    assert vmm_ipc.conclusion(report).startswith("refuted: LMCache's RawCudaIPCWrapper")
    assert vmm_ipc.conclusion(make_report({})).startswith("inconclusive")


def test_import_with_wrong_bytes_is_not_shared() -> None:
    report = make_report({("control", "CudaIPCWrapper"): True})
    report["allocations"]["control"]["wrappers"]["CudaIPCWrapper"]["import"] = {
        "ok": True,
        "result": {"equal": False, "bytes": 8},
    }
    assert not vmm_ipc.shared(report, "control", "CudaIPCWrapper")


def test_table_lists_every_step_and_the_conclusion() -> None:
    report = make_report({("control", "CudaIPCWrapper"): True})
    report["allocations"]["vmm"]["driver"] = {"cuIpcGetMemHandle": FAILED}
    report["conclusion"] = vmm_ipc.conclusion(report)
    lines = vmm_ipc.vmm_ipc_table(report)
    assert "control: CudaIPCWrapper export ok (90-byte descriptor)" in lines
    assert "control: CudaIPCWrapper import ok ({'equal': True, 'bytes': 8})" in lines
    assert "vmm: driver cuIpcGetMemHandle FAILED RuntimeError: boom" in lines
    assert "vmm: RawCudaIPCWrapper import -" in lines
    assert lines[-1].startswith("conclusion: confirmed:")
    assert vmm_ipc.vmm_ipc_ok(report)


def test_cli_vmm_files_and_vmm_ipc_without_cuda(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "vllm.whl", {f: "" for f in vmm_ipc.UPSTREAM_FILES})
    files = tmp_path / "files"
    done = subprocess.run(
        [sys.executable, str(PROOF), "vmm-files", "--wheel", str(wheel), "--to", str(files)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert str(files / vmm_ipc.UPSTREAM_FILES[0]) in done.stdout
    missing = subprocess.run(
        [sys.executable, str(PROOF), "vmm-ipc", "--vllm-files", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and "run `vmm-files` where the wheel is" in missing.stderr
