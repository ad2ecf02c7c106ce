"""The command line: `plan`, `ipc`, `tp`, `kernels`, `vmm-files`, `vmm-ipc` and `lmcache-server`, their options, and
`main`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from glm53.errors import Glm53Error

from . import DESCRIPTION, PROG, ProofError
from .geometry import parse_case, parse_counts
from .ipc import run_ipc
from .kernels import run_kernels
from .plan import (
    DEFAULT_CASES,
    DEFAULT_CHUNKS,
    DEFAULT_TP_CASES,
    L2_DESCRIPTIONS,
    Settings,
    TpSettings,
    check_settings,
    check_tp_settings,
    plan_lines,
)
from .report import emit, ipc_ok, ipc_table, kernels_ok, kernels_table, tp_ok, tp_table
from .server import lmcache_server_main
from .tp import run_tp
from .vmm_ipc import extract_upstream, run_vmm_ipc, vmm_ipc_ok, vmm_ipc_table


def add_ipc_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", action="append", dest="cases", metavar="PROFILE@CHUNK[:COUNTS]", help="repeatable")
    p.add_argument("--chunks", default=",".join(str(c) for c in DEFAULT_CHUNKS), help="chunks per request, a list")
    p.add_argument("--reps", type=int, default=5, help="timed requests per point (default 5)")
    p.add_argument("--l1-size-gb", type=float, help="each server's L1 (default: what the run stores, plus a quarter)")
    p.add_argument("--all-real-at", type=int, default=8, help="also the old all-real block ids at N chunks (0: off)")


def add_tp_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp-case", action="append", dest="tp_cases", metavar="PROFILE@CHUNK", help="repeatable")
    p.add_argument("--ranks", default="4,8", help="TP sizes to run, a list (default 4,8)")
    p.add_argument("--layouts", default="one", help="server layouts: one (the pod's server), per-rank; a list")
    p.add_argument("--tp-chunks", type=int, default=8, help="chunks per request (default 8)")
    p.add_argument("--tp-reps", type=int, default=10, help="timed rounds (default 10)")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "ipc", "tp"):
        p = sub.add_parser(name)
        if name in ("plan", "ipc"):
            add_ipc_options(p)
        if name in ("plan", "tp"):
            add_tp_options(p)
        p.add_argument("--warmup", type=int, default=1, help="untimed requests (rounds) first (default 1)")
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
        p.add_argument("--out", type=Path, help="directory for the JSON report and the server logs")
        p.add_argument(
            "--server-arg",
            action="append",
            dest="server_args",
            metavar="FLAG",
            help="a server flag beyond the chart's, for experiments (repeatable; --server-arg=--max-gpu-workers=8)",
        )
        p.add_argument(
            "--l2",
            choices=tuple(L2_DESCRIPTIONS),
            default="fs",
            help="the servers' L2 tier, as the chart's lmcache.l2.type: fs (its default; a temporary directory on "
            "this host's disk) or off",
        )
    k = sub.add_parser("kernels")
    k.add_argument("--reps", type=int, default=10)
    k.add_argument("--out", type=Path)
    vf = sub.add_parser("vmm-files", help="extract vLLM 0.34's VMM files from its wheel, to carry (no CUDA)")
    vf.add_argument("--wheel", type=Path, required=True, help="the vLLM wheel")
    vf.add_argument("--to", type=Path, required=True, help="the folder to write the small vllm package into")
    vi = sub.add_parser("vmm-ipc", help="share vLLM 0.34's ExtensibleTensor KV memory through LMCache's CUDA IPC")
    vi.add_argument("--vllm-files", type=Path, required=True, help="the folder `vmm-files` wrote")
    vi.add_argument("--out", type=Path)
    return parser.parse_args(list(argv))


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings(
        cases=tuple(parse_case(c) for c in (args.cases or DEFAULT_CASES)),
        chunks=parse_counts(args.chunks, "--chunks"),
        reps=args.reps,
        warmup=args.warmup,
        l1_size_gb=args.l1_size_gb,
        device=args.device,
        all_real_at=args.all_real_at,
        server_args=tuple(args.server_args or ()),
        l2=args.l2,
    )
    check_settings(settings)
    return settings


def tp_settings_from(args: argparse.Namespace) -> TpSettings:
    tp = TpSettings(
        cases=tuple(replace(parse_case(c), chunk_counts=None) for c in (args.tp_cases or DEFAULT_TP_CASES)),
        ranks=parse_counts(args.ranks, "--ranks"),
        layouts=tuple(x.strip() for x in args.layouts.split(",")),
        chunks=args.tp_chunks,
        reps=args.tp_reps,
        warmup=args.warmup,
        device=args.device,
        server_args=tuple(args.server_args or ()),
        l2=args.l2,
    )
    check_tp_settings(tp)
    return tp


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "lmcache-server":  # the server's own process: its arguments are lmcache's
        return lmcache_server_main(argv[1:])
    args = parse_args(argv)
    try:
        if args.command == "plan":
            print("\n".join(plan_lines(settings_from(args), tp_settings_from(args))))
            return 0
        if args.command == "vmm-files":
            print("\n".join(str(p) for p in extract_upstream(args.wheel, args.to)))
            return 0
        if args.command == "vmm-ipc":
            vmm_report = run_vmm_ipc(args.vllm_files)
            emit(vmm_report, args.out, "vmm-ipc.json", vmm_ipc_table(vmm_report))
            return 0 if vmm_ipc_ok(vmm_report) else 1
        if args.command == "kernels":
            report = run_kernels(args.reps)
            emit(report, args.out, "kernels.json", kernels_table(report))
            return 0 if kernels_ok(report) else 1
        out = args.out or Path.cwd()
        out.mkdir(parents=True, exist_ok=True)
        if args.command == "tp":
            tp_report = run_tp(tp_settings_from(args), out)
            emit(tp_report, out, "tp.json", tp_table(tp_report))
            return 0 if tp_ok(tp_report) else 1
        settings = settings_from(args)
        report = run_ipc(settings, out)
        emit(report, out, "ipc.json", ipc_table(report))
        return 0 if ipc_ok(report) else 1
    except (ProofError, Glm53Error) as exc:  # Glm53Error: the sidecar server failed to start
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
