#!/usr/bin/env python3
"""Sums an Nsight Compute kernel trace of a decode run up per step.

Input: `ncu --metrics gpu__time_duration.sum --print-units base --csv --page raw
--log-file F`
over a specd decode (each kernel timed alone: its own time, launch gaps
excluded). A step ends at each argmax_rows kernel (greedy sampling: once per
step); the last complete step is summed by kernel name (count, total us,
share), and the step's total is printed with the number of kernels, so the
step time measured without the profiler minus this total is the cost of the
boundaries between kernels.

usage: tools/ncu_step.py TRACE.csv [--json OUT]
"""
import csv
import io
import json
import sys


def rows(path):
    text = open(path, errors="replace").read()
    # ncu prints its own lines (==PROF== ...) before the CSV
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"{path}: no CSV header")
    rd = csv.DictReader(io.StringIO(text[start:]))
    out = []
    for r in rd:
        name = r.get("Kernel Name") or r.get("Function Name") or "?"
        v = r.get("gpu__time_duration.sum", "")
        try:
            t = float(v.replace(",", ""))
        except ValueError:
            continue  # the units row
        out.append((name, t))
    return out


def short(name):
    n = name.split("(")[0]
    for p in ("void ", "__global__ "):
        if n.startswith(p):
            n = n[len(p):]
    return n[:60]


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    ks = rows(args[0])
    scale = 1e-3  # ns (--print-units base) -> us
    ends = [i for i, (n, _) in enumerate(ks) if "argmax" in n]
    if len(ends) < 2:
        raise SystemExit(f"{args[0]}: fewer than two steps ({len(ks)} kernels)")
    a, b = ends[-2] + 1, ends[-1] + 1
    step = ks[a:b]
    tot = sum(t for _, t in step) * scale
    by = {}
    for n, t in step:
        k = short(n)
        c, s = by.get(k, (0, 0.0))
        by[k] = (c + 1, s + t * scale)
    print(f"{args[0]}: last complete step: {len(step)} kernels, {tot:.1f} us of kernel time "
          f"(mean {tot / max(len(step), 1):.2f} us a kernel); {len(ends)} steps traced")
    for k, (c, s) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {s:9.1f} us {100 * s / tot:5.1f}%  {c:4d} x {s / c:7.2f} us  {k}")
    if "--json" in args:
        json.dump({"trace": args[0], "kernels": len(step), "kernel_us": tot,
                   "by_kernel": [{"kernel": k, "count": c, "us": s} for k, (c, s) in by.items()]},
                  open(args[args.index("--json") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
