#!/usr/bin/env python3
"""adaptive_run.sh's table: reads the bench JSON of every run in DIR (LABEL-SPEC-rN.json),
takes each (run, batch)'s median repeat by tokens/s (the bench runs 3 repeats an
engine), and writes OUT/adaptive.json (every run: speedup over the same round's
plain, steps by k, ...) and OUT/summary.txt (min / median / max a cell and build).
Re-run it on a record's runs.tgz to rebuild the table.
usage: adaptive_merge.py DIR OUT COMMIT DEVICE "CONFIGS"
"""
import glob, json, os, statistics, sys
w, out, commit, dev, configs = sys.argv[1:6]
runs, temp = {}, {}
for p in glob.glob(os.path.join(w, "*.json")):
    label, spec, rnd = os.path.basename(p)[:-5].rsplit("-", 2)
    reps = {}
    d = json.load(open(p))
    temp[label] = d.get("temperature", 0)
    for x in d["results"]:
        reps.setdefault(x["batch"], []).append(x)
    for b, xs in reps.items():  # the median repeat (the lower middle of an even count)
        xs.sort(key=lambda x: x["decode_tokens_per_s"])
        runs[(label, spec, rnd, b)] = xs[(len(xs) - 1) // 2]
rows, cells = [], {}
for (label, spec, rnd, b), x in sorted(runs.items()):
    plain = runs.get((label, "none", rnd, b))
    if spec == "none" or not plain:
        continue
    s = x["decode_tokens_per_s"] / plain["decode_tokens_per_s"]
    rows.append(dict(build=label, spec=spec, round=rnd, batch=b, speedup=round(s, 3),
                     tokens_per_s=x["decode_tokens_per_s"], plain_tokens_per_s=plain["decode_tokens_per_s"],
                     steps_by_k=x.get("steps_by_k"), requests_not_drafting=x.get("requests_not_drafting"),
                     proposer_eager_passes=x.get("proposer_eager_passes"),
                     proposer_graph_cache_full=x.get("proposer_graph_cache_full"),
                     target_plain_steps=x.get("target_plain_steps"),
                     draft_phases=x.get("draft_phases"), draft_phases_learnt=x.get("draft_phases_learnt"),
                     draft_phases_oneoff=x.get("draft_phases_oneoff"),
                     host_ms_per_step=x.get("host_ms_per_step")))
    cells.setdefault((spec, b, label), []).append(s)
summary = {f"{spec} b{b} {label}": dict(min=round(min(v), 3), median=round(statistics.median(v), 3),
                                        max=round(max(v), 3), below_plain=sum(s < 1 for s in v), runs=len(v))
           for (spec, b, label), v in sorted(cells.items())}
# the noise band: plain decode of each build over the first build's at the
# same temperature, the same round and batch (with one build a
# temperature: none). A speedup within it of 1.0 is not a measured loss.
labels = sorted({k[0] for k in runs}, key=lambda l: configs.find(l + "="))
first = {}
for l in labels:
    first.setdefault(temp[l], l)
band = []
for (l, spec, rnd, b), x in runs.items():
    base = runs.get((first[temp[l]], "none", rnd, b))
    if spec == "none" and l != first[temp[l]] and base:
        band.append(x["decode_tokens_per_s"] / base["decode_tokens_per_s"])
plain_band = dict(min=round(min(band), 3), max=round(max(band), 3), n=len(band)) if band else None
json.dump(dict(benchmark="bench/gpu/adaptive_run.sh", commit=commit, device=dev, configs=configs,
               summary=summary, plain_band=plain_band, runs=rows),
          open(os.path.join(out, "adaptive.json"), "w"), indent=1)
with open(os.path.join(out, "summary.txt"), "w") as f:
    for k, v in summary.items():
        f.write(f"{k:28s} min {v['min']:.3f} median {v['median']:.3f} max {v['max']:.3f} "
                f"below plain {v['below_plain']}/{v['runs']}\n")
    if plain_band:
        f.write(f"plain of the other builds over the first's at their temperature, same round and batch: "
                f"{plain_band['min']:.3f}-{plain_band['max']:.3f} ({plain_band['n']} pairs)\n")
print(open(os.path.join(out, "summary.txt")).read(), end="")
