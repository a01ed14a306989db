#!/usr/bin/env python3
"""A serving A/B's record for bench/results: serve_ab.sh's summary.json
(its groups "rROUND LABEL cC rate R") with each label's build folder
replaced by a short name, the median TPOT of every server, build and
level over the rounds, with each round's value, and each proposer's TPOT
over the same round's plain server's (by round; and the mean, least and
most of a build's proposers at each level).

usage: serve_record.py SUMMARY_JSON OUT_JSON --tool T --commit C --what W
       [--device D] [--build LABEL=DIR=NAME ...]
  (LABEL: serve_ab.sh's label; DIR: the folder the call ran it from, which
  the record must not name; NAME: what the record says instead)"""
import argparse
import json
import re
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("summary")
ap.add_argument("out")
ap.add_argument("--tool", required=True)
ap.add_argument("--commit", required=True)
ap.add_argument("--what", required=True)
ap.add_argument("--device", default="1 x NVIDIA H200")
ap.add_argument("--build", action="append", default=[])
a = ap.parse_args()
text = open(a.summary).read()
for b in a.build:
    label, d, name = b.split("=", 2)
    text = text.replace(d.rstrip("/") + "/", name + "/")
groups = json.loads(text)["groups"]
tpot, over, spread = {}, {}, {}
for g in groups:
    m = re.match(r"r(\d+) (\S+) c(\d+)", g["name"])
    if not m:
        continue
    _, label, c = m.groups()
    plain = None
    for f in g["files"]:
        for lv in f["levels"]:
            tpot.setdefault(f"{f['label']} c{c} {label}", []).append(lv["tpot_p50_ms"])
            if f["label"] == "plain":
                plain = lv["tpot_p50_ms"]
    for f in g["files"]:
        for lv in f["levels"]:
            if plain and f["label"] != "plain" and lv.get("tpot_p50_ms"):
                r = round(lv["tpot_p50_ms"] / plain, 3)
                over.setdefault(f"{label} c{c} {f['label']}", []).append(r)
                spread.setdefault(f"{label} c{c}", []).append(r)
rec = {"tool": a.tool, "device": a.device, "commit": a.commit, "what": a.what,
       "tpot_p50_ms": {k: v for k, v in sorted(tpot.items())},
       "tpot_p50_ms_median": {k: round(statistics.median(v), 4) for k, v in sorted(tpot.items())},
       "tpot_over_plain_by_round": {k: v for k, v in sorted(over.items())},
       "tpot_over_plain_mean_min_max": {k: [round(statistics.mean(v), 3), min(v), max(v)]
                                        for k, v in sorted(spread.items())},
       "serve_ab": {"groups": groups}}
json.dump(rec, open(a.out, "w"), indent=1)
print(a.out)
