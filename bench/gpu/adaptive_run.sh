#!/usr/bin/env bash
# Adaptive k on the bundled model, each configuration in ROUNDS fresh
# engines (a run's outcome is bimodal: it drafts deep, or speculation goes
# off in its first steps; one run per build cannot tell two builds apart):
# plain and --k auto for mtp, eagle3 and draft at batch 1, 8 and 32, 512
# tokens a request, 3 repeats an engine (the bench's median), for each
# build given, the builds interleaved round by round. Writes OUT/adaptive.json
# (every run: speedup over the same round's plain, steps by k, requests
# not drafting, proposer passes run eagerly and those the graph cache
# turned away), OUT/summary.txt (min / median / max a cell and build) and
# OUT/runs.tgz (the bench's JSON and logs): three files, whatever the count
# of runs.
# usage: bench/gpu/adaptive_run.sh OUT COMMIT LABEL=BIN_DIR[:VAR=VALUE...][:--opt=VALUE...]...
#   (e.g. new=.carry/a pin0=.carry/a:SPECD_PINNED=0: the same build, a switch off)
#   ROUNDS (3), BATCH (1,8,32), SPECS ("mtp eagle3 draft"), MAXTOK (512)
set -uo pipefail
out=${1:?OUT}; commit=${2:-unknown}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 OUT COMMIT LABEL=BIN_DIR[:VAR=VALUE...]..."; exit 2; }
mkdir -p "$out"
. bench/gpu/env.sh
w=$(mktemp -d)
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
m=(--model models/specd-tiny --prompts models/specd-tiny/heldout_prompts.jsonl
   --batch "${BATCH:-1,8,32}" --max-tokens "${MAXTOK:-512}" --repeat 3 --device "${DEVICE:-cuda}"
   --commit "$commit" --machine "${dev:-unknown}")
for r in $(seq 1 "${ROUNDS:-3}"); do
    for cfg in "$@"; do
        parse_config "$cfg"
        for spec in none ${SPECS:-mtp eagle3 draft}; do
            d=()
            [ "$spec" = eagle3 ] && d=(--draft-model models/specd-tiny-eagle3)
            [ "$spec" = draft ] && d=(--draft-model models/specd-tiny-draft)
            k=(--k auto); [ "$spec" = none ] && k=()
            tag=$cfg_label-$spec-r$r
            env "${cfg_env[@]}" timeout 120 "$cfg_bin/bench/specd-bench-decode" "${m[@]}" "${cfg_args[@]}" \
                --spec "$spec" "${d[@]}" "${k[@]}" \
                --label "$tag" --out "$w/$tag.json" > "$w/$tag.txt" 2>&1 ||
                echo "== $tag: exit $?"
        done
    done
done
python3 - "$w" "$out" "$commit" "${dev:-unknown}" "$*" <<'PY'
import glob, json, os, statistics, sys
w, out, commit, dev, configs = sys.argv[1:6]
runs = {}
for p in glob.glob(os.path.join(w, "*.json")):
    label, spec, rnd = os.path.basename(p)[:-5].rsplit("-", 2)
    for x in json.load(open(p))["results"]:
        runs[(label, spec, rnd, x["batch"])] = x
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
# the noise band: plain decode of each build over the first build's, the
# same round and batch (with one build: none). A speedup within it of 1.0
# is not a measured loss.
labels = sorted({k[0] for k in runs}, key=lambda l: configs.find(l + "="))
band = [runs[(l, "none", rnd, b)]["decode_tokens_per_s"] / runs[(labels[0], "none", rnd, b)]["decode_tokens_per_s"]
        for (l, spec, rnd, b) in runs if spec == "none" and l != labels[0]
        and (labels[0], "none", rnd, b) in runs]
plain_band = dict(min=round(min(band), 3), max=round(max(band), 3), n=len(band)) if band else None
json.dump(dict(benchmark="bench/gpu/adaptive_run.sh", commit=commit, device=dev, configs=configs,
               summary=summary, plain_band=plain_band, runs=rows),
          open(os.path.join(out, "adaptive.json"), "w"), indent=1)
with open(os.path.join(out, "summary.txt"), "w") as f:
    for k, v in summary.items():
        f.write(f"{k:28s} min {v['min']:.3f} median {v['median']:.3f} max {v['max']:.3f} "
                f"below plain {v['below_plain']}/{v['runs']}\n")
    if plain_band:
        f.write(f"plain of the other builds over the first's, same round and batch: "
                f"{plain_band['min']:.3f}-{plain_band['max']:.3f} ({plain_band['n']} pairs)\n")
print(open(os.path.join(out, "summary.txt")).read(), end="")
PY
tar -C "$w" -czf "$out/runs.tgz" .
