#!/usr/bin/env python3
"""Sums up a kernel trace (SPECD_KERNEL_TRACE=FILE, kernels/cuda/trace.cu).

Each line: start_ns end_ns graph_id correlation_id device grid_x block_x name.
A CUDA graph replay's kernels share graph_id and the correlation id of the
launch. Per graph (the decode/verify step of one bucket, a proposer pass):
replays, kernels a replay, the replay's span (first start to last end), the
time some kernel runs (busy) and the rest (gaps: launch latency, tails,
dependencies); then the kernels by their time a replay.

usage: tools/kernel_trace.py TRACE [--graphs N] [--kernels N] [--json OUT]
"""
import argparse
import collections
import json
import shutil
import subprocess
import sys


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def short(name, width=64):
    # drop argument lists and nested template arguments past the first level
    depth, s = 0, []
    for ch in name:
        if ch == "(" and depth == 0:
            break
        if ch == "<":
            depth += 1
            if depth == 1:
                s.append("<")
            continue
        if ch == ">":
            depth -= 1
            if depth == 0:
                s.append(">")
            continue
        if depth <= 1:
            s.append(ch)
    t = "".join(s).replace("void ", "")
    return t if len(t) <= width else t[: width - 3] + "..."


def busy_time(iv):
    iv.sort()
    total, cur_s, cur_e = 0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--graphs", type=int, default=4)
    ap.add_argument("--kernels", type=int, default=25)
    ap.add_argument("--json")
    a = ap.parse_args()
    replays = collections.defaultdict(list)  # (graph, corr) -> [(s, e, name)]
    n = 0
    for line in open(a.trace):
        p = line.rstrip("\n").split(" ", 7)
        if len(p) < 8:
            continue
        s, e, g, c = int(p[0]), int(p[1]), int(p[2]), int(p[3])
        n += 1
        if g:
            replays[(g, c)].append((s, e, p[7]))
    by_graph = collections.defaultdict(list)
    for (g, _), ks in replays.items():
        by_graph[g].append(ks)
    names = demangle(sorted({k[2] for ks in replays.values() for k in ks}))
    graphs = []
    for g, reps in by_graph.items():
        spans = [max(k[1] for k in ks) - min(k[0] for k in ks) for ks in reps]
        busy = [busy_time([(k[0], k[1]) for k in ks]) for ks in reps]
        per = collections.defaultdict(lambda: [0, 0])  # name -> [count, ns]
        for ks in reps:
            for s, e, nm in ks:
                per[nm][0] += 1
                per[nm][1] += e - s
        R = len(reps)
        kern = sorted(({"kernel": short(names.get(nm, nm)), "per_replay": c / R,
                        "us_per_replay": t / R / 1e3, "mean_us": t / c / 1e3}
                       for nm, (c, t) in per.items()), key=lambda x: -x["us_per_replay"])
        graphs.append({"graph": g, "replays": R,
                       "kernels_per_replay": sum(len(ks) for ks in reps) / R,
                       "span_us": sum(spans) / R / 1e3, "busy_us": sum(busy) / R / 1e3,
                       "gap_us": (sum(spans) - sum(busy)) / R / 1e3,
                       "total_ms": sum(spans) / 1e6, "kernels": kern})
    graphs.sort(key=lambda x: -x["total_ms"])
    print(f"{n} kernels, {len(replays)} graph replays of {len(by_graph)} graphs")
    for gr in graphs[: a.graphs]:
        print(f"\ngraph {gr['graph']}: {gr['replays']} replays, {gr['kernels_per_replay']:.0f} kernels "
              f"each; a replay spans {gr['span_us']:.1f} us: kernels run {gr['busy_us']:.1f} us, "
              f"gaps {gr['gap_us']:.1f} us ({gr['gap_us'] / max(gr['span_us'], 1e-9):.0%})")
        print(f"  {'kernel':<64} {'n/replay':>8} {'us/replay':>10} {'mean us':>8}")
        for k in gr["kernels"][: a.kernels]:
            print(f"  {k['kernel']:<64} {k['per_replay']:8.1f} {k['us_per_replay']:10.1f} "
                  f"{k['mean_us']:8.2f}")
    if a.json:
        json.dump({"trace": a.trace, "kernels": n, "graphs": graphs}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
