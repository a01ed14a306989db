#!/usr/bin/env python3
"""A bench/results record of a serving A/B (bench/gpu/serve_ab.sh's
OUT/summary.json): each build's proposers' TPOT p50 over the same round's
plain server, by round, and their mean, least and most at each level, with
the groups themselves (paths made relative: a record names no machine's
folders).

usage: ab_record.py SUMMARY_JSON --commit C --device D --command CMD
           [--base-commit B] [--note N] [--name LABEL=NAME ...] > RECORD.json
  --name base=var-90b4c94 renames a build's label in the record's keys
"""
import argparse
import json
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("summary")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--base-commit")
    ap.add_argument("--device", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--name", action="append", default=[])
    ap.add_argument("--benchmark", default="serve-ab-adaptive-k")
    a = ap.parse_args()
    names = dict(n.split("=", 1) for n in a.name)
    with open(a.summary) as f:
        groups = json.load(f)["groups"]
    by_round = {}
    for g in groups:
        # "r1 base c16 rate 350"
        m = re.match(r"r(\d+) (\S+) c(\d+)", g["name"])
        if not m:
            continue
        build = names.get(m.group(2), m.group(2))
        tpot = {}
        for fl in g["files"]:
            lv = fl["levels"][0] if fl["levels"] else None
            if lv and lv.get("tpot_p50_ms"):
                tpot[fl["label"]] = lv["tpot_p50_ms"]
        plain = tpot.pop("plain", None)
        if not plain:
            continue
        for label, t in sorted(tpot.items()):
            key = f"{build} c{m.group(3)} {label}"
            by_round.setdefault(key, []).append(round(t / plain, 3))
    stats = {}
    for key, v in by_round.items():
        build, level, _ = key.split(" ", 2)
        stats.setdefault(f"{build} {level}", []).extend(v)
    rec = {"benchmark": a.benchmark, "commit": a.commit}
    if a.base_commit:
        rec["base_commit"] = a.base_commit
    rec.update({"device": a.device, "command": a.command, "note": a.note,
                "tpot_over_plain_by_round": dict(sorted(by_round.items())),
                "tpot_over_plain_mean_min_max": {
                    k: [round(sum(v) / len(v), 3), min(v), max(v)]
                    for k, v in sorted(stats.items())}})
    text = json.dumps(groups)
    # a build's folders are the call's: only their names stay
    text = re.sub(r'"(?:/[^"/]+)+/((?:r\d+-[^"/]+/)?serve-ab-[^"/]+\.json)"', r'"OUT/\1"', text)
    rec["groups"] = json.loads(text)
    json.dump(rec, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
