#!/usr/bin/env python3
"""Summarizes an Nsight Compute run with per-kernel stall metrics.

Input: `ncu --print-units base --csv --page raw --metrics M,... --log-file F`
where the metrics are gpu__time_duration.sum,
dram__throughput.avg.pct_of_peak_sustained_elapsed,
sm__warps_active.avg.pct_of_peak_sustained_active,
launch__registers_per_thread, launch__grid_size and
regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio (warps
stalled for each reason per issued instruction). Kernels of the same name
and grid are averaged; each row prints time, DRAM and occupancy, and the
three largest stall reasons (cycles a warp waits per instruction issued:
long_scoreboard = global or local memory, barrier = __syncthreads, ...).

usage: tools/ncu_deep.py RUN.csv [--json OUT]
"""
import csv
import io
import json
import sys

STALL = "smsp__average_warps_issue_stalled_"


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    text = open(args[0], errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"{args[0]}: no CSV header")
    groups = {}
    for r in csv.DictReader(io.StringIO(text[start:])):
        t = num(r.get("gpu__time_duration.sum", ""))
        if t is None:
            continue  # the units row
        name = (r.get("Kernel Name") or "?").split("(")[0].replace("void ", "")[:58]
        key = (name, r.get("launch__grid_size", "?"))
        g = groups.setdefault(key, {"n": 0, "sums": {}})
        g["n"] += 1
        for k, v in r.items():
            x = num(v)
            if x is not None and ("__" in k):
                g["sums"][k] = g["sums"].get(k, 0.0) + x
    out = []
    for (name, grid), g in sorted(groups.items(), key=lambda kv: -kv[1]["sums"].get(
            "gpu__time_duration.sum", 0) / kv[1]["n"]):
        m = {k: v / g["n"] for k, v in g["sums"].items()}
        stalls = sorted(((k[len(STALL):].replace("_per_issue_active.ratio", ""), v)
                         for k, v in m.items() if k.startswith(STALL)), key=lambda kv: -kv[1])
        row = {"kernel": name, "grid": grid, "count": g["n"],
               "us": m.get("gpu__time_duration.sum", 0) * 1e-3,
               "dram_pct": m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
               "occupancy_pct": m.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
               "regs": m.get("launch__registers_per_thread"),
               "stalls": dict(stalls[:6])}
        out.append(row)
        top = "  ".join(f"{k} {v:.1f}" for k, v in stalls[:3])
        dr = row["dram_pct"]
        oc = row["occupancy_pct"]
        print(f"{name:58s} {grid:>7s} x{g['n']:<3d} {row['us']:8.2f} us  "
              f"dram {dr if dr is not None else float('nan'):5.1f}%  "
              f"occ {oc if oc is not None else float('nan'):5.1f}%  {top}")
    if "--json" in args:
        json.dump(out, open(args[args.index("--json") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
