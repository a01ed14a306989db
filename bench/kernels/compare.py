#!/usr/bin/env python3
"""Before/after table of two specd-bench-kernels records (JSON).

    bench/kernels/compare.py BEFORE.json AFTER.json [--merge OUT.json --command CMD]

Rows are matched by (op, name, path, shape, n); times are the graph-replay
medians. --merge writes one record holding both runs (commit, device,
command, every row of each) plus the per-row ratios."""
import json
import sys


def key(r):
    shape = (r.get("N"), r.get("K"), r.get("heads"), r.get("D"), r.get("I"), r.get("top_k"))
    return (r["op"], r.get("name", ""), r["path"], shape, r["n"])


def label(r):
    if r["op"] == "moe_ffn":
        return "moe_ffn D=%d I=%d top-%d" % (r["D"], r["I"], r["top_k"])
    return r.get("name", "%s %dx%d" % (r["op"], r["N"], r["K"]))


def main():
    a = json.load(open(sys.argv[1]))
    b = json.load(open(sys.argv[2]))
    before = {key(r): r for r in a["rows"]}
    print("copy GB/s: before %.0f, after %.0f; read GB/s: before %.0f, after %.0f"
          % (a["copy_gbps"], b["copy_gbps"], a["read_gbps"], b["read_gbps"]))
    print("%-24s %-6s %4s %10s %10s %7s %7s %7s" % ("op", "path", "n", "us before", "us after",
                                                   "speedup", "/copy", "/copy0"))
    ratios = []
    for r in b["rows"]:
        k = key(r)
        p = before.get(k)
        if p is None and r["path"] in ("gemv", "fused"):
            p = before.get(k[:2] + ("auto",) + k[3:])
        s = p["us_graph"] / r["us_graph"] if p else float("nan")
        print("%-24s %-6s %4d %10s %10.2f %7s %7.3f %7s" % (
            label(r)[:24], r["path"], r["n"], "%.2f" % p["us_graph"] if p else "-", r["us_graph"],
            "%.2f" % s if p else "-", r["frac_copy"], "%.3f" % p["frac_copy"] if p else "-"))
        if p:
            ratios.append({"op": r["op"], "name": label(r), "path": r["path"], "n": r["n"],
                           "us_before": p["us_graph"], "us_after": r["us_graph"],
                           "speedup": round(s, 3), "frac_copy_before": p["frac_copy"],
                           "frac_copy_after": r["frac_copy"]})
    if "--merge" in sys.argv:
        out = sys.argv[sys.argv.index("--merge") + 1]
        cmd = sys.argv[sys.argv.index("--command") + 1] if "--command" in sys.argv else ""
        rec = {"benchmark": "kernels-decode", "device": b["device"], "command": cmd,
               "before": a, "after": b, "comparison": ratios}
        with open(out, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
