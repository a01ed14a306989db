#!/usr/bin/env bash
# What each decode kernel adds to a step in the real schedule (graphs,
# programmatic launch), from a -Dktrace=true build (kernels/cuda/common.cuh):
# specd-bench-decode on the random Llama-3-8B-shaped and DeepSeek-V2-Lite-
# shaped checkpoints at each batch size, one engine a run, SPECD_KTRACE set;
# tools/ktrace.py folds each trace by step and layer. A plain build's
# tokens/s beside each traced run tells what the stamps cost.
# usage: bench/gpu/ktrace_run.sh KT_BIN OUT COMMIT [PLAIN_BIN]
#   MODELS ("l8b dsv2lite"), BATCHES ("1 32"), MAXTOK (128), PLEN (64)
#   CKPT as in decode_run.sh
set -uo pipefail
kt=${1:?KT_BIN}; out=${2:?OUT}; commit=${3:-unknown}; plain=${4:-}
. bench/gpu/env.sh
mkdir -p "$out"
if [ -z "${CKPT:-}" ]; then
    shm=$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
    if [ "${shm:-0}" -ge 60 ]; then CKPT=/dev/shm/specd-ckpt; else CKPT=/tmp/specd-ckpt; fi
fi
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
w=$(mktemp -d)
for m in ${MODELS:-l8b dsv2lite}; do
    random_ckpt "$m" || continue
    for b in ${BATCHES:-1 32}; do
        common=(--model "$CKPT/$m" --batch "$b" --max-tokens "${MAXTOK:-128}" --prompt-len "${PLEN:-64}"
                --warmup 8 --device cuda --commit "$commit" --machine "${dev:-unknown}")
        tag=$m-b$b
        SPECD_KTRACE=$w/$tag.kt "$kt/bench/specd-bench-decode" "${common[@]}" --label "$tag-kt" \
            --out "$w/$tag-kt.json" > "$w/$tag-kt.txt" 2>&1 || echo "== $tag traced: exit $?"
        [ -n "$plain" ] && { "$plain/bench/specd-bench-decode" "${common[@]}" --label "$tag" \
            --out "$w/$tag.json" > "$w/$tag.txt" 2>&1 || echo "== $tag: exit $?"; }
        for f in "$w/$tag.kt".*; do
            case $f in *.names|*.json) continue ;; esac
            [ -f "$f" ] || continue
            python3 tools/ktrace.py "$f" --label "$tag" --json "$f.json" | tee -a "$out/ktrace.txt"
        done
        grep -h "tok/s\|tokens/s" "$w/$tag-kt.txt" "$w/$tag.txt" 2>/dev/null | tail -4 | sed "s/^/$tag: /" |
            tee -a "$out/ktrace.txt"
    done
done
python3 - "$w" "$out" "$commit" "${dev:-unknown}" <<'PY'
import glob, json, os, sys
w, out, commit, dev = sys.argv[1:5]
rec = {"benchmark": "bench/gpu/ktrace_run.sh", "commit": commit, "device": dev,
       "traces": [json.load(open(f)) for f in sorted(glob.glob(f"{w}/*.kt.*.json"))],
       "runs": {}}
for f in sorted(glob.glob(f"{w}/*-b*.json")):
    if ".kt." in f:
        continue
    try:
        r = json.load(open(f))
    except Exception:
        continue
    rec["runs"][os.path.basename(f)[:-5]] = r.get("summary", r.get("results", r))
json.dump(rec, open(f"{out}/ktrace.json", "w"), indent=1)
PY
tar -C "$w" -czf "$out/ktrace-runs.tgz" . 2>/dev/null
