"""The real `lmcache server`, with phase probes: its flags as the chart renders them, the probes around its store
and retrieve handlers and their copies (`lmcache-server`, run in the server's own process), starting N of them, and
reading back their CPU time and phase records."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.pod.loopback import LOCALHOST, free_ports
from glm53.testing.sidecar import serving

from .geometry import Case
from .stats import now_ns

# The package folder: `python3 <it> lmcache-server ...` runs its __main__.py in each server's process.
PACKAGE_DIR = Path(__file__).resolve().parent
SERVER_START_SECONDS = 180.0
# The environment variable that tells `lmcache-server` where to write its phase records.
PHASE_LOG_ENV = "GLM53_GPU_PROOF_PHASE_LOG"

# lmcache 0.5.6 lmcache/usage_telemetry/identity.py:38-40: either switch stops the start-up usage report (the chart's
# sidecar sets both); lmcache/banner.py:28,62: no banner in the server's log.
SERVER_ENV = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "LMCACHE_DISABLE_BANNER": "1"}


def server_argv(
    program: Sequence[str],
    case: Case,
    *,
    port: int,
    http_port: int,
    l1_size_gb: float,
    shm_name: str | None,
    l2_dir: Path | None,
) -> list[str]:
    """`program` and the sidecar's flags as the chart renders them for an install of this case (`profile`,
    `lmcache.chunkSize`, `lmcache.separateObjectGroups`; charts/glm53/templates/engine/_lmcache.tpl,
    glm53.lmcacheServerArgs).

    The GPU host runs this proof without helm-python-sdk, so the flags are spelled here;
    tests/benchmarks/test_gpu_proof_dryrun.py proves they equal the chart's, ports and L1 size aside. `--shm-name` is
    the CPU rehearsal's own: it puts L1 in a POSIX SHM segment (lmcache 0.5.6
    lmcache/v1/multiprocess/server.py:442-461), which the chart never asks for. `l2_dir`: the chart's default fs L2
    tier in that directory (glm53.lmcacheL2Adapter), None for `lmcache.l2.type=off`.
    """
    argv = [*program, "--host", LOCALHOST, "--port", str(port), "--chunk-size", str(case.chunk_size)]
    if case.separate_object_groups:
        argv.append("--separate-object-groups")
    argv += ["--l1-size-gb", f"{l1_size_gb:g}", "--eviction-policy", "LRU"]
    argv += ["--http-host", LOCALHOST, "--http-port", str(http_port)]
    if l2_dir is not None:
        adapter = json.dumps({"base_path": str(l2_dir), "type": "fs"}, separators=(",", ":"))
        argv += ["--l2-adapter", adapter, "--l2-prefetch-policy", "retain"]
    argv.append("--no-run-script-api-enabled")
    return argv if shm_name is None else [*argv, "--shm-name", shm_name]


def install_phase_probes(log_path: Path) -> None:
    """Wrap the released server's store/retrieve handlers and its per-object-group copy so that every request leaves
    one JSON line in `log_path`: when the handler started and ended, when its first copy was queued and its last
    returned, the copy's span on the server's GPU stream (CUDA events), and the bytes of the memory objects it copied.

    Where: the store handler calls `store_with_chunk_mask` (lmcache 0.5.6 lmcache/v1/multiprocess/modules/
    lmcache_driven_transfer.py:561-572); `retrieve` is the handler itself (:852-863; wrapped with functools.wraps, so
    the `request_handler` options and signature it is registered by stay: lmcache/v1/multiprocess/
    request_handler.py:60-64, 104-130); both copy through the module's `transfer_kv_per_object_group` (:780-791,
    :1053-1062), on the cache context's stream. Handlers for different workers run on different threads
    (lmcache/v1/multiprocess/affinity_pool.py:1-10), so the open record is thread-local. Cost per request: two CUDA
    event records per copy call and one queue put; the events are resolved on a thread of their own.
    """
    import queue

    from lmcache.v1.multiprocess.modules import lmcache_driven_transfer as ldt

    torch: Any = importlib.import_module("torch")

    current = threading.local()
    finished: queue.Queue[dict[str, Any]] = queue.Queue()
    use_cuda = torch.cuda.is_available()
    module_class = ldt.LMCacheDrivenTransferModule

    def probe_handler(op: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def handler(self: Any, key: Any, instance_id: int, *args: Any, **kwargs: Any) -> Any:
            record: dict[str, Any] = {
                "op": op,
                "request_id": key.request_id,
                "instance_id": instance_id,
                "worker_id": key.worker_id,
                "enter_ns": now_ns(),
                "transfers": 0,
                "bytes": 0,
                "transfer_cpu_ns": 0,
            }
            current.record = record
            try:
                return method(self, key, instance_id, *args, **kwargs)
            finally:
                record["exit_ns"] = now_ns()
                current.record = None
                finished.put(record)

        return handler

    original_transfer = ldt.transfer_kv_per_object_group

    def transfer(cache_context: Any, block_ids_gpu: Any, memory_objs: Any, *args: Any, **kwargs: Any) -> Any:
        record = getattr(current, "record", None)
        if record is None:
            return original_transfer(cache_context, block_ids_gpu, memory_objs, *args, **kwargs)
        started = now_ns()
        record.setdefault("first_transfer_ns", started)
        if use_cuda and "start_event" not in record:
            record["start_event"] = torch.cuda.Event(enable_timing=True)
            record["start_event"].record(cache_context.stream)
        try:
            return original_transfer(cache_context, block_ids_gpu, memory_objs, *args, **kwargs)
        finally:
            if use_cuda:
                record["end_event"] = torch.cuda.Event(enable_timing=True)
                record["end_event"].record(cache_context.stream)
            record["last_transfer_ns"] = now_ns()
            record["transfer_cpu_ns"] += record["last_transfer_ns"] - started
            record["transfers"] += 1
            record["bytes"] += sum(int(m.get_size()) for m in memory_objs if m is not None)

    def resolve() -> None:
        with log_path.open("a", encoding="utf-8") as out:
            while True:
                record = finished.get()
                start, end = record.pop("start_event", None), record.pop("end_event", None)
                if end is not None and start is not None:
                    end.synchronize()
                    record["copy_done_ns"] = now_ns()
                    record["copy_s"] = start.elapsed_time(end) / 1e3
                elif "first_transfer_ns" in record:  # CPU: the copies ran inside the calls
                    record["copy_done_ns"] = record["last_transfer_ns"]
                    record["copy_s"] = (record["last_transfer_ns"] - record["first_transfer_ns"]) / 1e9
                out.write(json.dumps(record) + "\n")
                out.flush()

    threading.Thread(target=resolve, name="gpu-proof-phases", daemon=True).start()
    module_class.store_with_chunk_mask = probe_handler("store", module_class.store_with_chunk_mask)
    module_class.retrieve = probe_handler("retrieve", module_class.retrieve)
    ldt.transfer_kv_per_object_group = transfer


def lmcache_server_main(argv: Sequence[str]) -> int:
    """`lmcache <argv>` (the released CLI, lmcache/cli/main.py) with the phase probes, when PHASE_LOG_ENV is set."""
    log = os.environ.get(PHASE_LOG_ENV)
    if log:
        install_phase_probes(Path(log))
    from lmcache.cli.main import main as lmcache_main

    lmcache_main(list(argv))
    return 0


@dataclass(frozen=True)
class ServerHandle:
    """One started server: where to reach it, its process id and its logs."""

    port: int
    http_port: int
    pid: int
    log: Path
    phase_log: Path

    @property
    def url(self) -> str:
        return f"tcp://{LOCALHOST}:{self.port}"


@contextlib.contextmanager
def running_servers(
    case: Case,
    device: str,
    l1_size_gb: float,
    count: int,
    out_dir: Path,
    label: str,
    extra_args: Sequence[str] = (),
    l2: str = "fs",
) -> Iterator[list[ServerHandle]]:
    """`count` real servers with the sidecar's flags (`server_argv`, then `extra_args`), started in parallel, each a
    process of its own running `lmcache-server` (the released server with phase probes), each with its own fs L2
    directory under a temporary one (removed after) unless `l2` is `off`; yields their handles and stops them all."""
    ports = free_ports(2 * count)
    logs = [out_dir / (f"{label}.log" if count == 1 else f"{label}-s{i}.log") for i in range(count)]
    program = (sys.executable, str(PACKAGE_DIR), "lmcache-server", "server")
    managers = []
    tiers = contextlib.ExitStack()
    l2_root = (
        None if l2 == "off" else Path(tiers.enter_context(tempfile.TemporaryDirectory(prefix="glm53-gpu-proof-l2-")))
    )
    for i, log in enumerate(logs):
        phase_log = log.with_suffix(".phases.jsonl")
        phase_log.unlink(missing_ok=True)
        shm_name = f"glm53-gpu-proof-{os.getpid()}-{ports[2 * i]}" if device == "cpu" else None
        argv = server_argv(
            program,
            case,
            port=ports[2 * i],
            http_port=ports[2 * i + 1],
            l1_size_gb=l1_size_gb,
            shm_name=shm_name,
            l2_dir=None if l2_root is None else l2_root / f"server-{i}",
        )
        argv += list(extra_args)
        env = {**SERVER_ENV, PHASE_LOG_ENV: str(phase_log)}
        managers.append(serving(argv, env, ports[2 * i + 1], log, SERVER_START_SECONDS))
    with tiers, contextlib.ExitStack() as stack:
        handles: list[ServerHandle] = []
        errors: list[BaseException] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=count) as pool:
            started = [pool.submit(manager.__enter__) for manager in managers]
            for i, (manager, future) in enumerate(zip(managers, started, strict=True)):
                try:
                    process = future.result()
                except BaseException as exc:  # stop the others, then report the first failure
                    errors.append(exc)
                    continue
                stack.push(manager)
                handles.append(
                    ServerHandle(
                        ports[2 * i], ports[2 * i + 1], process.pid, logs[i], logs[i].with_suffix(".phases.jsonl")
                    )
                )
        if errors:
            raise errors[0]
        yield handles


def server_cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of the server processes (all their threads) and their children so far."""
    psutil: Any = importlib.import_module("psutil")  # untyped; on the GPU host's image and in LMCache's requirements

    total = 0.0
    for pid in pids:
        process = psutil.Process(pid)
        for proc in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def read_phase_log(path: Path, wanted: set[tuple[str, str, int]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The server's phase records by (op, request id, instance id), waiting briefly for those not yet resolved."""
    deadline = time.monotonic() + 15.0
    records: dict[tuple[str, str, int], dict[str, Any]] = {}
    while True:
        records.clear()
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(line)
                    records[(record["op"], record["request_id"], int(record["instance_id"]))] = record
        if wanted <= records.keys() or time.monotonic() > deadline:
            return records
        time.sleep(0.2)
