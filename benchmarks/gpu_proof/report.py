"""The reports: the short tables printed last, the JSON documents written to `--out`, and each command's verdict
(exit 0 only when every check held)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def ratio(value: float | None, limit: float | None) -> str:
    return "-" if value is None or not limit else f"{value / limit:.0%}"


def ipc_table(report: dict[str, Any]) -> list[str]:
    """The short tables printed last: per case and chunk count GB/s each way (ratio to a pinned memcpy of the same
    size), then each way's phases (medians, ms)."""
    copies = {c["bytes"]: c for c in report.get("pinned_memcpy", [])}
    lines = [
        "case              chunks ids       MiB st/rt     hit bytes-ok null-ok  store GB/s (of D2H)  "
        "retrieve GB/s (of H2D)  visible ms"
    ]
    phase_lines = [
        "phases, ms (median)     ids       op        total  transport  pre-copy    copy  post-copy   reply  "
        "in+reply  GB/s"
    ]
    for case in report["cases"]:
        if "error" in case:
            lines.append(f"{case['case']:<17} ERROR {case['error'][:150]}")
            continue
        for point in case["points"]:
            st, rt = point["store"], point["retrieve"]
            d2h = copies.get(point["bytes_stored_planned"], {}).get("d2h_gbps")
            h2d = copies.get(point["bytes_restored_planned"], {}).get("h2d_gbps")
            moved = f"{point['bytes_stored_planned'] / 2**20:.1f}/{point['bytes_restored_planned'] / 2**20:.1f}"
            ok = point["all_equal"] and point["bytes_match_plan"]
            lines.append(
                f"{case['case']:<17} {point['chunks']:>6} {point['layout']:<8} {moved:>13}  "
                f"{'yes' if point['all_hit'] else 'NO':<3} {'yes' if ok else 'NO':<8} "
                f"{'yes' if point['null_block_untouched'] else 'NO':<7}  "
                f"{st['gbps'] or 0:>10.2f} ({ratio(st['gbps'], d2h):>4})  "
                f"{rt['gbps'] or 0:>13.2f} ({ratio(rt['gbps'], h2d):>4})  {ms(point['visible_after_s']):>10}"
            )
            for op, row in (("store", st), ("retrieve", rt)):
                phase_lines.append(
                    f"{case['case'] + ' x' + str(point['chunks']):<23} {point['layout']:<8}  {op:<8} "
                    f"{ms(row['total_s']):>7} {ms(row.get('transport_in_s')):>10} {ms(row.get('pre_copy_s')):>9} "
                    f"{ms(row.get('copy_s')):>7} {ms(row.get('post_copy_s')):>10} {ms(row.get('reply_s')):>7} "
                    f"{ms(row.get('client_transport_s')):>9} {row['gbps'] or 0:>5.1f}"
                )
    for copy in report.get("pinned_memcpy", []):
        lines.append(
            f"pinned cudaMemcpy {copy['bytes'] / 2**20:>8.1f} MiB: D2H {copy['d2h_gbps']:.2f} GB/s, "
            f"H2D {copy['h2d_gbps']:.2f} GB/s"
        )
    return lines + phase_lines


def tp_table(report: dict[str, Any]) -> list[str]:
    """Per TP run: aggregate GB/s each way beside the N concurrent pinned copies, latencies, server CPU."""
    lines = [
        "tp (single-GPU)        N layout   srv wr  ok    store agg GB/s (of N D2H)  p50/p99 ms     "
        "retrieve agg GB/s (of N H2D)  p50/p99 ms     per-rank rt GB/s  srv cores  pre-copy p50/p99 ms st|rt"
    ]
    for run in report["runs"]:
        head = f"{run['case']:<21} {run['ranks']:>2} {run['layout']:<8}"
        if "error" in run:
            lines.append(f"{head} ERROR {run['error'][:150]}")
            continue
        st, rt = run["store"], run["retrieve"]
        d2h, h2d = run["pinned_d2h_aggregate_gbps"], run["pinned_h2d_aggregate_gbps"]
        ok = run["all_hit"] and run["all_equal"] and run["null_block_untouched"]
        ok = ok and st["bytes_match_plan"] and rt["bytes_match_plan"]
        lines.append(
            f"{head} {run['servers']:>3} {run['writers']:>2}  {'yes' if ok else 'NO':<4}"
            f"  {st['aggregate_gbps'] or 0:>10.2f} ({ratio(st['aggregate_gbps'], d2h):>4} of {d2h or 0:.1f})"
            f"  {ms(st['latency_p50_s'])}/{ms(st['latency_p99_s']):<7}"
            f"  {rt['aggregate_gbps'] or 0:>13.2f} ({ratio(rt['aggregate_gbps'], h2d):>4} of {h2d or 0:.1f})"
            f"  {ms(rt['latency_p50_s'])}/{ms(rt['latency_p99_s']):<7}"
            f"  {rt['per_rank_gbps_median'] or 0:>16.2f}  {run['server_cpu_cores'] or 0:>9.2f}"
            f"  {ms(st['server_pre_copy_p50_s'])}/{ms(st['server_pre_copy_p99_s'])}"
            f" | {ms(rt['server_pre_copy_p50_s'])}/{ms(rt['server_pre_copy_p99_s'])}"
        )
    return lines


def write_report(report: dict[str, Any], out: Path, name: str, table: list[str]) -> str:
    """`name` (the JSON report) and the same name with .txt (the tables) in `out`; returns the JSON text."""
    text = json.dumps(report, indent=2, sort_keys=True, default=str)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text + "\n", encoding="utf-8")
    (out / name).with_suffix(".txt").write_text("\n".join(table) + "\n", encoding="utf-8")
    return text


def emit(report: dict[str, Any], out: Path | None, name: str, table: list[str]) -> None:
    text = (
        json.dumps(report, indent=2, sort_keys=True, default=str)
        if out is None
        else write_report(report, out, name, table)
    )
    print(text)
    print("\n".join(table))


def kernels_table(report: dict[str, Any]) -> list[str]:
    """One line per kernel shape: GB/s each way and whether the bytes matched both references."""
    return [
        f"kernel {r['shape']}: D2H {r['d2h_gbps']:.1f} GB/s equal={r['d2h_equal']} "
        f"(torch fallback: {r['d2h_equal_torch_fallback']}), "
        f"H2D {r['h2d_gbps']:.1f} GB/s equal={r['h2d_equal']}"
        for r in report["kernels"]
    ]


def kernels_ok(report: dict[str, Any]) -> bool:
    return all(r["d2h_equal"] and r["d2h_equal_torch_fallback"] and r["h2d_equal"] for r in report["kernels"])


def ipc_ok(report: dict[str, Any]) -> bool:
    """Every case ran, and at every point every lookup hit, every block came back byte-equal, the null block stayed
    untouched and the server moved the planned bytes."""
    return all(
        "error" not in c
        and all(
            p["all_hit"] and p["all_equal"] and p["null_block_untouched"] and p["bytes_match_plan"] for p in c["points"]
        )
        for c in report["cases"]
    )


def tp_ok(report: dict[str, Any]) -> bool:
    """Every TP run ran and held the same checks as `ipc_ok`, on every rank."""
    return all(
        "error" not in r
        and r["all_hit"]
        and r["all_equal"]
        and r["null_block_untouched"]
        and r["store"]["bytes_match_plan"]
        and r["retrieve"]["bytes_match_plan"]
        for r in report["runs"]
    )
