#!/usr/bin/env python3
"""tools/ktrace.py on synthetic kernel traces (the -Dktrace=true build's file
format: a count, then a timestamp in ns and a shape word a stamp) whose
exposed times are known: it must find the step's period among a prefill's
noise, fold the layers, give each kernel its time within rounding, and name
the shapes from FILE.names (one name, or every kernel of a shared shape)."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "ktrace.py")


def sig(gx, gy, gz, bx):
    return gx | gy << 24 | gz << 40 | bx << 48


def write_trace(path, seed, layers, layer, head, embed, steps, gap_us):
    rng = np.random.default_rng(seed)
    t, stamps = 0, []

    def emit(k, us):
        nonlocal t
        stamps.append((t, sig(*k[:4])))
        t += int(round(us * 1000))

    for i in range(97):  # a prefill: other shapes, other times
        emit((3 + i % 5, 2, 1, 64), 7.0 + rng.random())
    for _ in range(steps):
        for k in embed:
            emit(k, k[4] + 0.2 * rng.random())
        for _ in range(layers):
            for k in layer:
                emit(k, k[4] + 0.2 * rng.random())
        for k in head:
            emit(k, k[4] + 0.2 * rng.random())
        t += int(gap_us * 1000)
    for i in range(41):  # the next batch's prefill
        emit((9, 1 + i % 3, 1, 128), 5.0)
    a = np.array(stamps, dtype=np.uint64).reshape(-1)
    np.concatenate((np.array([len(stamps)], dtype=np.uint64), a)).tofile(path)


def main():
    # a layer of 6 kernels; the norm's shape is shared by two kernels
    layer = [(1, 1, 1, 1024, 2.5), (1536, 1, 1, 256, 11.9), (16, 1, 1, 256, 3.3),
             (1, 8, 16, 256, 4.6), (1, 32, 1, 128, 2.9), (1024, 1, 1, 256, 10.4)]
    head = [(1, 1, 1, 1024, 2.9), (32064, 1, 1, 256, 243.0), (1, 16, 1, 256, 75.0)]
    embed = [(1, 1, 1, 256, 4.0)]
    names = {sig(1, 1, 1, 1024): ["_Z11norm_kernelILi1ELi1EEvPfPKf", "_Z8add_normv"],
             sig(1, 8, 16, 256): ["_Z15attn_dec_kernelILi4EEv8att_args"],
             sig(1536, 1, 1, 256): ["_Z11gemv_kernelILi2ELi1ELb1ELb0ELi4ELi2EEv7mm_argsi"]}
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "kt.0")
        write_trace(f, 7, 32, layer, head, embed, 40, 30.0)
        with open(f + ".names", "w") as nf:
            for s, ns in names.items():
                for n in ns:
                    nf.write(f"{s:x} {n}\n")
        out = os.path.join(d, "kt.json")
        r = subprocess.run([sys.executable, TOOL, f, "--json", out], capture_output=True, text=True)
        if r.returncode != 0:
            print("ktrace.py failed:", r.stderr)
            return 1
        j = json.load(open(out))
        P = 1 + 32 * len(layer) + len(head)

        def check(what, ok, detail=""):
            nonlocal fails
            print(f"{'ok  ' if ok else 'FAIL'} {what} {detail}")
            fails += not ok

        check("the step's period", j["period"] == P, f"{j['period']} vs {P}")
        check("whole steps averaged", j["steps"] >= 30, str(j["steps"]))
        lay = j.get("layer", {})
        check("the layer fold", lay.get("kernels") == len(layer) and lay.get("layers") == 32, str(lay))
        want = sum(k[4] + 0.1 for k in layer)
        check("us a layer", abs(lay.get("us_per_layer", 0) - want) < 0.05,
              f"{lay.get('us_per_layer')} vs {want:.2f}")
        rows = [k for k in j["kernels"] if k["where"] == "layer"]
        # the fold starts at the first full layer: rotate the expectation to it
        first = next(i for i in range(len(layer)) if rows[0]["shape"].startswith(
            f"{layer[i][0]}x{layer[i][1]}x{layer[i][2]}/{layer[i][3]}"))
        for j_, row in enumerate(rows):
            k = layer[(first + j_) % len(layer)]
            check(f"layer kernel {j_} {row['shape']}", abs(row["us"] - (k[4] + 0.1)) < 0.05,
                  f"{row['us']} vs {k[4] + 0.1:.2f}")
        byshape = {row["shape"]: row.get("kernel", "") for row in j["kernels"]}
        check("a name", byshape.get("1x8x16/256") == "attn_dec_kernel<4>", byshape.get("1x8x16/256"))
        check("template arguments", byshape.get("1536x1x1/256") == "gemv_kernel<2, 1, 1, 0, 4, 2>",
              byshape.get("1536x1x1/256"))
        check("a shared shape names both", byshape.get("1x1x1/1024") == "add_norm|norm_kernel<1, 1>",
              byshape.get("1x1x1/1024"))
        check("no name where none was launched", byshape.get("16x1x1/256") == "",
              repr(byshape.get("16x1x1/256")))
        # the last kernel of the step carries the host's gap
        other = {row["shape"]: row["us"] for row in j["kernels"] if row["where"] == "other"}
        check("the gap lands on the step's last kernel", abs(other.get("1x16x1/256", 0) - 105.1) < 0.2,
              str(other.get("1x16x1/256")))
    print(f"{'FAIL' if fails else 'ok'}: {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
