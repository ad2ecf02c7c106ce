"""Benchmark of the stage step on loopback: its staging rate, the cost of its verification pass, and of a restart.

Why: the stage step downloads hundreds of GB before the engine may start, then reads every byte back to hash it
against what the hub lists; both must be cheap next to the download itself, and a restart (a rolling update) must cost
seconds, not a download. Measured here against the hub stand-in (`glm53.testing.hub_standin`, loopback, so the "network"
is as fast as this machine's loopback and disk: real downloads are slower, which makes the verification's share
smaller), serving the tiny dense model `glm53 tiny-model` makes plus `--files` generated weight shards of `--file-mib`
MiB each (random bytes, LFS files like a checkpoint's shards).

Printed per run, as `glm53 stage-weights run` (a subprocess, as in the container) records them in its completion
marker: bytes downloaded and the download's rate; the verification pass's seconds, rate and overhead (its time over
the download's); the command's wall time. Then, for comparison, the real client's own `snapshot_download` of the same
repository (no resume across processes, no verification pass), and two restarts that find the marker: with the
default `--reverify sizes` and with `--reverify full`. Asserts nothing.

Run: ``.venv/bin/python benchmarks/stage_bench.py [--files 2] [--file-mib 256] [--runs 1] [--max-workers 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from glm53 import tinymodels
from glm53.staging.layout import RepoLayout
from glm53.testing.hub_standin import HubStandIn, host_directory

REPO = "glm53/bench"
MIB = 2**20


def make_repository(directory: Path, files: int, file_mib: int) -> None:
    tinymodels.build(tinymodels.get_shape("dense"), directory)
    generator = random.Random(5300)
    for index in range(files):
        path = directory / f"shard-{index + 1:05d}-of-{files:05d}.safetensors"
        with path.open("wb") as handle:
            for _ in range(file_mib):
                handle.write(generator.randbytes(MIB))


def glm53(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "glm53", *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"glm53 {' '.join(args[:2])} failed: {result.stderr.strip() or result.stdout[-500:]}")
    return wall, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=2, help="generated weight shards (default 2)")
    parser.add_argument("--file-mib", type=int, default=256, help="MiB per generated shard (default 256)")
    parser.add_argument("--runs", type=int, default=1, help="fresh stagings to measure (default 1)")
    parser.add_argument("--max-workers", type=int, default=8, help="files fetched at once (default 8)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="glm53-stage-bench-") as temp:
        root = Path(temp)
        started = time.perf_counter()
        make_repository(root / "repo", args.files, args.file_mib)
        hosted = host_directory(REPO, root / "repo")
        print(
            f"repository: {len(hosted.files)} files, {hosted.total_bytes / MIB:.1f} MiB (the tiny dense model and "
            f"{args.files} x {args.file_mib} MiB shards), made and hashed in {time.perf_counter() - started:.1f} s"
        )
        with HubStandIn([hosted]) as hub:
            common = ["--repo", REPO, "--endpoint", hub.endpoint, "--max-workers", str(args.max_workers)]
            overheads = []
            for run in range(1, args.runs + 1):
                cache = root / f"cache-{run}"
                wall, _ = glm53("stage-weights", "run", "--cache-dir", str(cache), *common)
                facts = json.loads(RepoLayout(cache, REPO).marker("main").read_text())["facts"]
                download_s, verify_s = facts["downloadSeconds"], facts["verifySeconds"]
                rate = facts["downloadedBytes"] / MIB / download_s
                verify_rate = facts["verifiedBytes"] / MIB / verify_s
                overheads.append(verify_s / download_s)
                print(
                    f"run {run}: downloaded {facts['downloadedBytes'] / MIB:.1f} MiB in {download_s:.2f} s "
                    f"({rate:.0f} MiB/s); verification pass {verify_s:.2f} s ({verify_rate:.0f} MiB/s), "
                    f"{100 * verify_s / download_s:.0f} % of the download's time; command wall {wall:.2f} s"
                )
            client = root / "client"
            code = (
                "import sys, time; from huggingface_hub import snapshot_download as get; t = time.perf_counter(); "
                "get(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3], max_workers=int(sys.argv[4])); "
                "print(time.perf_counter() - t)"
            )
            env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_XET": "1"}
            command = [sys.executable, "-c", code, REPO, str(client), hub.endpoint, str(args.max_workers)]
            client_s = float(subprocess.run(command, check=True, env=env, capture_output=True, text=True).stdout)
            print(
                f"huggingface_hub's own snapshot_download of the same repository: {client_s:.2f} s in the call "
                f"({hosted.total_bytes / MIB / client_s:.0f} MiB/s; no resume after a kill, no verification pass)"
            )
            cache = root / "cache-1"
            sizes, _ = glm53("stage-weights", "run", "--cache-dir", str(cache), *common)
            full, _ = glm53("stage-weights", "run", "--cache-dir", str(cache), *common, "--reverify", "full")
            print(f"restart with the marker: {sizes:.2f} s wall (--reverify sizes), {full:.2f} s (--reverify full)")
        worst = 100 * max(overheads)
        print(f"verification overhead (pass time / download time): {worst:.0f} % at most over {args.runs} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
