#!/usr/bin/env python3
"""Merges specd-bench-decode runs (one JSON per engine configuration) into
one record (bench/results/decode*.json) and prints its summary tables.

Speedup of a speculative run = its decode tokens/s over the plain run's of
the same model, batch size, prompts, max_tokens and graphs setting, within
this record; it is also given over the mean accepted length (tokens emitted
per verify step), the most speculation can give if a verify step cost what a
plain step costs and drafting were free.

    python3 bench/decode/merge.py --out decode.json [--copy-bw bw.json]
        [--timings timings.txt] [--note TEXT] RUN.json...
"""
import argparse
import json
import sys


def key(d, x):
    return (d["model"], x["batch"], d["prompts"], d["prompt_len"], d["max_tokens"], d["graphs"],
            d.get("temperature", 0))


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--copy-bw")
    ap.add_argument("--timings", help="lines 'name seconds'")
    ap.add_argument("--note", default="")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    runs = []
    for p in a.runs:
        try:
            with open(p) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"merge: skipping {p}: {e}", file=sys.stderr)
    # plain decode tokens/s by (model, batch, prompts, ..., graphs): median of repeats
    plain = {}
    for d in runs:
        # "-simt"/"-nopdl"/"-split2" runs: the same plain decode without a
        # default (the SIMT kernels, plain launches, attention's split level
        # 2): an A/B, not the baseline
        if d["spec"] == "none" and not d.get("synthetic_accept") and \
                not d.get("label", "").endswith(("-simt", "-nopdl", "-split2")):
            for x in d["results"]:
                plain.setdefault(key(d, x), []).append(x["decode_tokens_per_s"])
    plain = {k: median(v) for k, v in plain.items()}
    rows, speedups = [], []
    for d in runs:
        by_batch = {}
        for x in d["results"]:
            by_batch.setdefault(x["batch"], []).append(x)
        for b, xs in sorted(by_batch.items()):
            tok = median([x["decode_tokens_per_s"] for x in xs])
            x = xs[0]
            row = dict(label=d.get("label", ""), model=d["model"], spec=d["spec"], k=d["k"],
                       synthetic_accept=d.get("synthetic_accept"), graphs=d["graphs"], batch=b,
                       decode_tokens_per_s=tok,
                       per_request_tokens_per_s=median([y["per_request_tokens_per_s"] for y in xs]),
                       step_ms=median([y["step_ms"] for y in xs]),
                       draft_ms_per_step=median([y["draft_ms_per_step"] for y in xs]),
                       verify_ms_per_step=median([y["verify_ms_per_step"] for y in xs]),
                       mean_accepted_length=x["mean_accepted_length"],
                       acceptance_by_position=x["acceptance_by_position"],
                       step_bytes_gb=x["step_bytes_gb"], floor_tokens_per_s=x["floor_tokens_per_s"],
                       fraction_of_floor=(tok / x["floor_tokens_per_s"]
                                          if x["floor_tokens_per_s"] else None))
            rows.append(row)
            base = plain.get(key(d, x))
            if d["spec"] != "none" and base:
                sp = tok / base
                speedups.append(dict(label=row["label"], model=d["model"], spec=d["spec"], k=d["k"],
                                     synthetic_accept=d.get("synthetic_accept"), graphs=d["graphs"],
                                     batch=b, tokens_per_s=tok, plain_tokens_per_s=base, speedup=sp,
                                     mean_accepted_length=row["mean_accepted_length"],
                                     speedup_over_mean_len=sp / row["mean_accepted_length"],
                                     draft_ms_per_step=row["draft_ms_per_step"],
                                     verify_ms_per_step=row["verify_ms_per_step"]))
    rec = dict(benchmark="decode", commit=runs[0]["commit"] if runs else None,
               machine=runs[0]["machine"] if runs else None, note=a.note)
    if a.copy_bw:
        with open(a.copy_bw) as f:
            rec["copy_bandwidth"] = json.load(f)
    if a.timings:
        with open(a.timings) as f:
            rec["timings_s"] = {ln.split()[0]: float(ln.split()[1]) for ln in f if len(ln.split()) == 2}
    rec["summary"] = rows
    rec["speedups"] = speedups
    rec["runs"] = runs
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=2)
    print(f"{'label':24} {'B':>3} {'graph':5} {'tok/s':>9} {'tok/s/req':>9} {'step_ms':>8} "
          f"{'draft':>7} {'verify':>7} {'len':>5} {'floor':>8} {'frac':>6}")
    for r in rows:
        fr = f"{r['fraction_of_floor']:.3f}" if r["fraction_of_floor"] is not None else "-"
        fl = f"{r['floor_tokens_per_s']:.0f}" if r["floor_tokens_per_s"] else "-"
        print(f"{r['label'][:24]:24} {r['batch']:3} {r['graphs']:5} {r['decode_tokens_per_s']:9.1f} "
              f"{r['per_request_tokens_per_s']:9.1f} {r['step_ms']:8.3f} {r['draft_ms_per_step']:7.3f} "
              f"{r['verify_ms_per_step']:7.3f} {r['mean_accepted_length']:5.2f} {fl:>8} {fr:>6}")
    print()
    print(f"{'speculative run':24} {'B':>3} {'accept':16} {'speedup':>8} {'len':>5} {'speedup/len':>11}")
    for s in speedups:
        print(f"{s['label'][:24]:24} {s['batch']:3} {(s['synthetic_accept'] or 'real')[:16]:16} "
              f"{s['speedup']:8.3f} {s['mean_accepted_length']:5.2f} {s['speedup_over_mean_len']:11.3f}")


if __name__ == "__main__":
    main()
