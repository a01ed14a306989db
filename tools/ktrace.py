#!/usr/bin/env python3
"""Reads a kernel trace (a -Dktrace=true CUDA build run with SPECD_KTRACE=FILE:
kernels/cuda/common.cuh) and prints what each kernel of a repeating step adds
to the step in the real schedule (graphs, programmatic launch).

A stamp is taken when a kernel's wait for the kernel before returns, so the
difference between consecutive stamps is the earlier kernel's exposed time:
the part of the step it holds up, whatever a serialized profiler reads. The
decode steps of one batch size replay one graph: the stamps repeat with the
step's period (found from the kernels' shapes), and each position of the
period is averaged over every step of the longest steady stretch. The step's
layers repeat inside it: positions are also folded by layer, the first full
layer pattern onwards; the kernels outside it (embedding, head, argmax) and
the host's gap between steps (inside the delta of the step's last kernel)
are listed one by one.

Kernel names come from FILE.names (the build writes the shape word and
the symbol of every distinct launch): a shape launched by several kernels
shows all of them.

usage: tools/ktrace.py FILE [--min-period N] [--json OUT] [--label L]
"""
import argparse
import json
import os
import re
import sys

import numpy as np


def shape(sig):
    gx = sig & 0xFFFFFF
    gy = (sig >> 24) & 0xFFFF
    gz = (sig >> 40) & 0xFF
    bx = (sig >> 48) & 0xFFFF
    return f"{gx}x{gy}x{gz}/{bx}"


def short_name(mangled):
    """a kernel's name from its mangled symbol: _Z15attn_dec_kernelILi4EEv...
    -> attn_dec_kernel<4> (integer and bool template arguments only)"""
    m = re.match(r"_Z(\d+)", mangled)
    if not m:
        return mangled
    n, i = int(m.group(1)), m.end()
    name, i = mangled[i:i + n], i + n
    if mangled[i:i + 1] != "I":
        return name
    args, i = [], i + 1
    while i < len(mangled) and mangled[i] == "L":
        a = re.match(r"L[a-z](n?\d+)E", mangled[i:])
        if not a:
            break
        args.append(a.group(1).replace("n", "-"))
        i += a.end()
    return f"{name}<{', '.join(args)}>" if args else name


def load_names(path):
    """shape word -> the kernels launched with it (FILE.names beside the trace)"""
    names = {}
    if not os.path.exists(path):
        return names
    for line in open(path):
        parts = line.split(None, 1)
        if len(parts) == 2:
            names.setdefault(int(parts[0], 16), []).append(short_name(parts[1].strip()))
    return names


def runs(m):
    """(start, end) of the runs of True in m"""
    d = np.diff(np.concatenate(([0], m.astype(np.int8), [0])))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def find_period(sig, pmin, pmax):
    """the step period and the steady stretch: the smallest p >= pmin whose
    longest run of sig[i] == sig[i + p] is (nearly) the longest of any p.
    A repeat inside a step (a few layers) breaks at every step's head; the
    step's own period runs on over the whole decode."""
    longest = {}
    n = len(sig)
    for p in range(pmin, min(pmax, n // 4) + 1):
        s, e = runs(sig[:-p] == sig[p:])
        longest[p] = int((e - s).max()) + p if len(s) else 0
    if not longest or max(longest.values()) == 0:
        return None, None
    top = max(longest.values())
    best = min(p for p in longest if longest[p] >= 0.95 * top)
    s, e = runs(sig[:-best] == sig[best:])
    i = int(np.argmax(e - s))
    return best, (int(s[i]), int(e[i]) + best)


def layer_fold(cyc, lmax=64):
    """the layer pattern inside one period: (L, first, count) or None"""
    P = len(cyc)
    best = None
    for L in range(2, min(lmax, P // 3) + 1):
        starts, ends = runs(np.array([cyc[j] == cyc[j + L] for j in range(P - L)]))
        if len(starts) == 0:
            continue
        i = int(np.argmax(ends - starts))
        run = int(ends[i] - starts[i])
        if run >= 2 * L:
            n = (run + L) // L
            if best is None or n * L > best[2] * best[0]:
                best = (L, int(starts[i]), n)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--min-period", type=int, default=24)
    ap.add_argument("--max-period", type=int, default=4000)
    ap.add_argument("--json")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    raw = np.fromfile(a.file, dtype=np.uint64)
    n = int(raw[0])
    rec = raw[1:1 + 2 * n].reshape(n, 2)
    t = rec[:, 0].astype(np.int64)
    sig = rec[:, 1]
    P, (lo, hi) = find_period(sig, a.min_period, a.max_period)
    if P is None:
        print(f"{a.file}: {n} stamps, no repeating step found")
        return 1
    steps = (hi - lo) // P - 1  # whole periods with a following stamp
    if steps < 2:
        print(f"{a.file}: period {P} but only {steps} steps")
        return 1
    dt = np.diff(t[lo:lo + steps * P + 1]).reshape(steps, P) / 1000.0  # us
    # drop the first and last steps of the stretch (warm-up, the next batch)
    body = dt[1:-1] if steps > 4 else dt
    mean = body.mean(axis=0)
    med = np.median(body, axis=0)
    cyc = [int(x) for x in sig[lo:lo + P]]
    names = load_names(a.file + ".names")

    def kname(v):
        k = sorted(set(names.get(v, [])))
        return "|".join(k) if k else ""
    fold = layer_fold(cyc)
    step_us = float(body.sum(axis=1).mean())
    out = {"file": os.path.basename(a.file), "label": a.label, "stamps": n, "period": P, "steps": int(body.shape[0]),
           "step_us_mean": round(step_us, 2), "step_us_median": round(float(np.median(body.sum(axis=1))), 2)}
    print(f"{a.label or a.file}: {n} stamps; step of {P} kernels, {body.shape[0]} steps; "
          f"step {step_us:.1f} us (median {out['step_us_median']:.1f})")
    rows = []
    if fold:
        L, f0, nl = fold
        inlayer = set(range(f0, f0 + L * nl))
        lay = np.array([[mean[f0 + l * L + j] for j in range(L)] for l in range(nl)])
        print(f"  layer pattern: {L} kernels x {nl} layers from position {f0}: "
              f"{lay.sum(axis=1).mean():.2f} us a layer, {lay.sum():.1f} us of the step")
        print(f"  {'pos':>4} {'shape':<22} {'mean us':>8} {'min layer':>9} {'max layer':>9}  kernel")
        for j in range(L):
            col = lay[:, j]
            v = cyc[f0 + j]
            rows.append({"where": "layer", "pos": j, "shape": shape(v), "kernel": kname(v),
                         "us": round(float(col.mean()), 3), "min": round(float(col.min()), 3),
                         "max": round(float(col.max()), 3)})
            print(f"  {j:>4} {shape(v):<22} {col.mean():8.2f} {col.min():9.2f} {col.max():9.2f}  {kname(v)}")
        print("  outside the layers (the last one holds the host's gap between steps):")
        for i in list(range(f0 + L * nl, P)) + list(range(0, f0)):
            rows.append({"where": "other", "pos": i, "shape": shape(cyc[i]), "kernel": kname(cyc[i]),
                         "us": round(float(mean[i]), 3), "median": round(float(med[i]), 3)})
            print(f"  {i:>4} {shape(cyc[i]):<22} {mean[i]:8.2f} (median {med[i]:.2f})  {kname(cyc[i])}")
        out["layer"] = {"kernels": L, "layers": nl, "first": f0,
                        "us_per_layer": round(float(lay.sum(axis=1).mean()), 3)}
    else:
        for i in range(P):
            rows.append({"where": "step", "pos": i, "shape": shape(cyc[i]), "kernel": kname(cyc[i]),
                         "us": round(float(mean[i]), 3)})
            print(f"  {i:>4} {shape(cyc[i]):<22} {mean[i]:8.2f}  {kname(cyc[i])}")
    out["kernels"] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
