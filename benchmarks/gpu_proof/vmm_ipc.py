"""`vmm-files` and `vmm-ipc`: can LMCache's CUDA IPC share a KV cache that vLLM 0.34's extensible KV cache allocated?

vLLM 0.34 allocates the KV cache with the CUDA driver's virtual-memory calls (cuMemCreate/cuMemAddressReserve/cuMemMap)
when its extensible KV cache is on, and says legacy CUDA IPC cannot export that memory (vllm 0.34.0
`vllm/config/vllm.py:3218-3222`). It only turns the cache off for LMCacheMPConnector when `kv_connector_module_path` is
unset (`vllm/distributed/kv_transfer/kv_connector/factory.py:137-151`); with the path set, LMCache 0.5.6's connector
class inherits the base `kv_cache_access` (`IN_PROCESS`, `.../kv_connector/v1/base.py:205-213`), so the cache is
extensible and created with no export handle type (`vllm/v1/worker/extensible_kv_cache.py:405-417`). This checks that on
the GPU with the upstream code itself:

- ``vmm-files`` (on the machine that has the vLLM 0.34.0 wheel; no CUDA): extracts `vllm/utils/vmm_driver.py` and
  `vllm/utils/extensible_tensor.py` verbatim from the wheel into a small package folder (empty `__init__.py` files and a
  stub `vllm/logger.py`: they import nothing else of vLLM), to be carried to the GPU host.
- ``vmm-ipc`` (on the GPU host, LMCache installed): allocates per-layer KV tensors three ways -- ``control``
  (`torch.empty`, torch's caching allocator: the chart's `--no-enable-extensible-kv-cache`), ``vmm`` (an upstream
  `ExtensibleTensor` with `export_handle_types=0`, committed as `ExtensibleKVCache.commit` does) and ``vmm-fd`` (the
  same with `MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, what vLLM requests for a connector declaring `EXPORTS_FD`) -- fills
  each with a byte pattern, wraps it with each of LMCache 0.5.6's CUDA IPC wrappers
  (`lmcache/v1/platform/devices/cuda/ipc_wrapper.py`: `CudaIPCWrapper` over `UntypedStorage._share_cuda_()`,
  `RawCudaIPCWrapper` over `cudaIpcGetMemHandle`, `VmmCudaIPCWrapper` over `cuMemExportToShareableHandle`), encodes
  each with `DeviceIPCWrapper.Serialize` (the MP wire's encoding), and has a second process (spawned, as the server is
  a separate process) `Deserialize` and `to_tensor()` each one and compare the bytes. Beside the wrappers, a ctypes
  probe asks the driver directly: `cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)` and `cuIpcGetMemHandle`.

Every step's outcome is recorded verbatim (``ok`` or the exception's type and message); nothing is timed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import ProofError

# The two upstream files, loaded verbatim; everything else under vllm/ is a stub.
UPSTREAM_FILES = ("vllm/utils/vmm_driver.py", "vllm/utils/extensible_tensor.py")
# vmm_driver.py imports `init_logger` from vllm.logger and calls `.warning_once` on FABRIC-capable hosts only.
LOGGER_STUB = '''"""Stub of vllm.logger for the two upstream VMM files (benchmarks/gpu_proof/vmm_ipc.py)."""

import logging


class _Logger(logging.Logger):
    def warning_once(self, msg, *args, **kwargs):
        self.warning(msg, *args, **kwargs)


def init_logger(name):
    logging.setLoggerClass(_Logger)
    try:
        return logging.getLogger(name)
    finally:
        logging.setLoggerClass(logging.Logger)
'''
STUBS = {"vllm/__init__.py": "", "vllm/utils/__init__.py": "", "vllm/logger.py": LOGGER_STUB}

# The KV geometry: per layer (segment), `capacity` blocks reserved and `committed` blocks committed, of
# (block_size, width) bf16 each (an MLA-like page: 64 tokens of 576 values). 256 blocks are 9 granules of 2 MiB.
LAYERS = 2
BLOCK_SIZE = 64
WIDTH = 576
CAPACITY_BLOCKS = 256
COMMITTED_BLOCKS = 64
BF16_BYTES = 2
BLOCK_BYTES = BLOCK_SIZE * WIDTH * BF16_BYTES

ALLOCATIONS = ("control", "vmm", "vmm-fd")
WRAPPERS = ("CudaIPCWrapper", "RawCudaIPCWrapper", "VmmCudaIPCWrapper")
IMPORT_TIMEOUT_S = 180.0
ERROR_CHARS = 600

# CUpointer_attribute values (cuda-bindings 13.5.0: CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
# CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14).
_ATTR_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_ATTR_ALLOWED_HANDLE_TYPES = 14
_IPC_HANDLE_BYTES = 64


# ---------------------------------------------------------------------------------------------- pure parts


def extract_upstream(wheel: Path, dest: Path) -> list[Path]:
    """Write the two upstream files (verbatim, from the wheel) and the stubs under `dest`; the paths written."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            missing = [f for f in UPSTREAM_FILES if f not in names]
            if missing:
                raise ProofError(f"{wheel}: no {', '.join(missing)} in the wheel")
            contents = {f: zf.read(f) for f in UPSTREAM_FILES}
    except (OSError, zipfile.BadZipFile) as exc:
        raise ProofError(f"{wheel}: {exc}") from exc
    written = []
    for rel, data in [*contents.items(), *((k, v.encode()) for k, v in STUBS.items())]:
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    return written


def outcome(fn: Callable[[], Any]) -> tuple[dict[str, Any], Any]:
    """Run one step: ({"ok": True, "result": ...} or {"ok": False, "error": "Type: message"}, its value or None)."""
    try:
        value = fn()
    except Exception as exc:  # every failure is the answer here, recorded verbatim
        return {"ok": False, "error": describe_error(exc)}, None
    return {"ok": True, "result": summarize(value)}, value


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def summarize(value: Any) -> Any:
    """A step's value as JSON: scalars as they are, anything else by its type name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): summarize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [summarize(v) for v in value]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return type(value).__name__


def step_text(step: dict[str, Any] | None) -> str:
    if step is None:
        return "-"
    if step["ok"]:
        result = step.get("result")
        return "ok" if result in (None, True) else f"ok ({result})"
    return f"FAILED {step['error']}"


def shared(report: dict[str, Any], allocation: str, wrapper: str) -> bool:
    """Whether `wrapper` exported `allocation` and the second process opened it and read the same bytes."""
    row = report["allocations"].get(allocation, {}).get("wrappers", {}).get(wrapper, {})
    imported = row.get("import") or {}
    return bool(row.get("export", {}).get("ok") and imported.get("ok") and imported.get("result", {}).get("equal"))


def conclusion(report: dict[str, Any]) -> str:
    """The one-sentence answer."""
    legacy = ("CudaIPCWrapper", "RawCudaIPCWrapper")
    control = any(shared(report, "control", w) for w in legacy)
    vmm_legacy = [w for w in legacy if shared(report, "vmm", w)]
    vmm_fd = shared(report, "vmm-fd", "VmmCudaIPCWrapper")
    if not control:
        return "inconclusive: the control (torch.empty) was not shared through LMCache's legacy CUDA IPC either"
    if vmm_legacy:
        return (
            f"refuted: LMCache's {', '.join(vmm_legacy)} shared vLLM 0.34's driver-mapped (ExtensibleTensor) KV "
            "memory with a second process"
        )
    tail = (
        "; only VmmCudaIPCWrapper shares it, and only when the memory is created with a POSIX-fd export handle (vmm-fd)"
        if vmm_fd
        else ""
    )
    return (
        "confirmed: LMCache 0.5.6's legacy CUDA IPC (CudaIPCWrapper, RawCudaIPCWrapper) shares the torch.empty KV "
        "tensor but not vLLM 0.34's driver-mapped (ExtensibleTensor) KV tensor, so the chart must keep "
        f"--no-enable-extensible-kv-cache{tail}"
    )


def vmm_ipc_table(report: dict[str, Any]) -> list[str]:
    """One line per (allocation, step): the outcome, then the conclusion."""
    lines = []
    for name, alloc in report["allocations"].items():
        lines.append(f"{name}: allocate {step_text(alloc.get('allocate'))}")
        for probe, step in alloc.get("driver", {}).items():
            lines.append(f"{name}: driver {probe} {step_text(step)}")
        for wrapper, row in alloc.get("wrappers", {}).items():
            lines.append(f"{name}: {wrapper} export {step_text(row.get('export'))}")
            lines.append(f"{name}: {wrapper} import {step_text(row.get('import'))}")
    lines.append(f"conclusion: {report['conclusion']}")
    return lines


def vmm_ipc_ok(report: dict[str, Any]) -> bool:
    """The run answered the question (either way): the control was shared."""
    return not report["conclusion"].startswith("inconclusive")


# ---------------------------------------------------------------------------------------------- GPU parts


def _pattern(flat: Any) -> Any:
    """The byte pattern for a flat uint8 tensor, which the importer can recompute: byte i = i % 251."""
    import torch

    return torch.arange(flat.numel(), device=flat.device, dtype=torch.int64).remainder(251).to(torch.uint8)


def _fill(tensor: Any) -> None:
    import torch

    flat = tensor.view(torch.uint8).view(-1)
    flat.copy_(_pattern(flat))


def _pattern_equal(tensor: Any) -> dict[str, Any]:
    import torch

    flat = tensor.contiguous().view(torch.uint8).view(-1)
    return {"equal": bool(torch.equal(flat, _pattern(flat))), "bytes": flat.numel()}


class _Driver:
    """The two driver calls the probe needs, through ctypes (independent of cuda-python)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong]
        lib.cuIpcGetMemHandle.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        for fn in (lib.cuPointerGetAttribute, lib.cuIpcGetMemHandle, lib.cuGetErrorName):
            fn.restype = ctypes.c_int
        self.lib = lib

    def name(self, code: int) -> str:
        msg = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(msg))
        return f"{code} {msg.value.decode() if msg.value else '?'}"

    def attribute(self, attr: int, ptr: int) -> int:
        value = ctypes.c_ulonglong()
        code = self.lib.cuPointerGetAttribute(ctypes.byref(value), attr, ptr)
        if code:
            raise RuntimeError(f"cuPointerGetAttribute({attr}) returned {self.name(code)}")
        return value.value

    def ipc_handle(self, ptr: int) -> str:
        handle = (ctypes.c_char * _IPC_HANDLE_BYTES)()
        code = self.lib.cuIpcGetMemHandle(handle, ptr)
        if code:
            raise RuntimeError(f"cuIpcGetMemHandle returned {self.name(code)}")
        return "CUDA_SUCCESS"


def _layer_tensors(allocation: str, vllm: dict[str, Any]) -> tuple[list[Any], Any]:
    """The per-layer KV tensors of one allocation kind, and what keeps their memory alive."""
    import torch

    shape = (COMMITTED_BLOCKS, BLOCK_SIZE, WIDTH)
    if allocation == "control":
        tensors = [torch.empty(shape, dtype=torch.bfloat16, device="cuda:0") for _ in range(LAYERS)]
        return tensors, None
    handle_types = vllm["POSIX_FD"] if allocation == "vmm-fd" else 0
    segment = CAPACITY_BLOCKS * BLOCK_BYTES
    # As ExtensibleKVCache.__init__ (extensible_kv_cache.py:124-132): one segment per layer, the reservation sized for
    # the capacity; then commit() (:195-215) grows every segment's prefix to the committed blocks, zeroing them.
    buffer = vllm["ExtensibleTensor"](
        segment * LAYERS,
        device=torch.device("cuda", 0),
        segment_capacities=[segment] * LAYERS,
        export_handle_types=handle_types,
    )
    buffer.resize_segments_([COMMITTED_BLOCKS * BLOCK_BYTES] * LAYERS, zero_new=True)
    # As committed_views (:224-266): a view over each segment's committed prefix (segment_view), shaped per layer.
    tensors = [buffer.segment_view(i).view(torch.bfloat16).view(shape) for i in range(LAYERS)]
    return tensors, buffer


def _driver_probes(driver: _Driver | None, ptr: int) -> dict[str, Any]:
    if driver is None:
        return {}
    return {
        "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)": outcome(
            lambda: driver.attribute(_ATTR_IS_LEGACY_CUDA_IPC_CAPABLE, ptr)
        )[0],
        "cuPointerGetAttribute(ALLOWED_HANDLE_TYPES)": outcome(
            lambda: driver.attribute(_ATTR_ALLOWED_HANDLE_TYPES, ptr)
        )[0],
        "cuIpcGetMemHandle": outcome(lambda: driver.ipc_handle(ptr))[0],
    }


def importer_main(conn: Any) -> None:
    """The second process (the LMCache server's side): decode each descriptor, open it, compare the bytes, close."""
    from multiprocessing.reduction import recv_handle

    results: dict[str, dict[str, Any]] = {}
    try:
        import torch

        torch.zeros(1, device="cuda:0")  # the primary context, current on this thread before any driver call
        from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
        from lmcache.v1.platform.devices.cuda import ipc_wrapper

        items = conn.recv()
        fds = {key: recv_handle(conn) for key, _, has_fd in items if has_fd}
        ipc_wrapper.set_vmm_fd_resolver(lambda export_id: os.dup(fds[export_id]))
        for key, payload, _ in items:

            def open_one(payload: bytes = payload) -> dict[str, Any]:
                wrapper = DeviceIPCWrapper.Deserialize(payload)
                try:
                    tensor = wrapper.to_tensor()
                    torch.cuda.synchronize()
                    return _pattern_equal(tensor)
                finally:
                    wrapper.close()

            results[key.hex()] = outcome(open_one)[0]
        conn.send(("ok", results))
    except Exception as exc:
        conn.send(("error", describe_error(exc)))


def _versions() -> dict[str, Any]:
    import subprocess
    from importlib import metadata

    import torch

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
    }
    for dist in ("lmcache", "cuda-bindings", "cuda-python", "cupy-cuda13x", "cupy-cuda12x"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    try:
        query = "--query-gpu=name,driver_version,memory.total"
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        info["nvidia_smi"] = describe_error(exc)
    return info


def run_vmm_ipc(vllm_files: Path) -> dict[str, Any]:
    """Allocate, export, import in a second process; every step's outcome and the conclusion."""
    import multiprocessing
    import uuid
    from multiprocessing.reduction import send_handle

    if not all((vllm_files / f).is_file() for f in UPSTREAM_FILES):
        raise ProofError(f"{vllm_files}: no {' or '.join(UPSTREAM_FILES)}; run `vmm-files` where the wheel is")
    sys.path.insert(0, str(vllm_files.resolve()))
    import torch

    if not torch.cuda.is_available():
        raise ProofError("vmm-ipc needs a CUDA device")
    torch.zeros(1, device="cuda:0")  # the primary context, current on this thread before any driver call
    from vllm.utils import extensible_tensor, vmm_driver

    vllm = {
        "ExtensibleTensor": extensible_tensor.ExtensibleTensor,
        "POSIX_FD": vmm_driver.MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    }
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.devices.cuda import ipc_wrapper

    report: dict[str, Any] = {
        "command": "vmm-ipc",
        "versions": _versions(),
        "vllm_files": [str(vllm_files / f) for f in UPSTREAM_FILES],
        "geometry": {
            "layers": LAYERS,
            "layer_shape": [COMMITTED_BLOCKS, BLOCK_SIZE, WIDTH],
            "dtype": "bfloat16",
            "capacity_blocks": CAPACITY_BLOCKS,
            "committed_blocks": COMMITTED_BLOCKS,
        },
        "vmm_unavailable_reason": {
            str(t): vmm_driver.vmm_unavailable_reason(t) for t in (0, vmm_driver.MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        },
        "allocations": {},
    }
    driver_step, driver = outcome(_Driver)
    report["driver_probe"] = driver_step
    keep: list[Any] = []  # tensors and buffers alive until the importer is done
    items: list[tuple[bytes, bytes, bool]] = []
    fds: list[tuple[bytes, int]] = []
    where: dict[bytes, tuple[str, str]] = {}
    for name in ALLOCATIONS:
        alloc_step, made = outcome(functools.partial(_layer_tensors, name, vllm))
        entry: dict[str, Any] = {"allocate": alloc_step, "wrappers": {}}
        report["allocations"][name] = entry
        if made is None:
            continue
        tensors, buffer = made
        keep.append(made)
        for t in tensors:
            _fill(t)
        torch.cuda.synchronize()
        first = tensors[0]
        entry["data_ptr"] = hex(first.data_ptr())
        entry["buffer"] = (
            {"physical_chunks": buffer.num_physical_chunks, "physical_bytes": buffer.physical_bytes}
            if buffer is not None
            else "torch caching allocator"
        )
        entry["driver"] = _driver_probes(driver, first.data_ptr())
        for wrapper_name in WRAPPERS:
            cls = getattr(ipc_wrapper, wrapper_name)

            def export(cls: Any = cls, first: Any = first) -> tuple[Any, bytes]:
                wrapper = cls.wrap(first)
                return wrapper, DeviceIPCWrapper.Serialize(wrapper)

            export_step, exported = outcome(export)
            row: dict[str, Any] = {"export": export_step, "import": None}
            entry["wrappers"][wrapper_name] = row
            if exported is None:
                continue
            wrapper, payload = exported
            keep.append(wrapper)
            export_step["result"] = f"{len(payload)}-byte descriptor"
            fd_payload = wrapper.fd_payload() if hasattr(wrapper, "fd_payload") else None
            key = fd_payload[0] if fd_payload else uuid.uuid4().bytes
            if fd_payload:
                fds.append(fd_payload)
            items.append((key, payload, fd_payload is not None))
            where[key] = (name, wrapper_name)

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=importer_main, args=(child,), daemon=True)
    proc.start()
    try:
        parent.send(items)
        for _, fd in fds:
            send_handle(parent, fd, proc.pid)
        if not parent.poll(IMPORT_TIMEOUT_S):
            raise ProofError(f"the importing process sent nothing in {IMPORT_TIMEOUT_S:.0f} s")
        status, results = parent.recv()
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    report["importer"] = {"status": status, "exitcode": proc.exitcode}
    if status != "ok":
        report["importer"]["error"] = results
        results = {}
    for key, (name, wrapper_name) in where.items():
        report["allocations"][name]["wrappers"][wrapper_name]["import"] = results.get(key.hex())
    for item in keep:
        if hasattr(item, "close"):
            item.close()
    report["conclusion"] = conclusion(report)
    return report
