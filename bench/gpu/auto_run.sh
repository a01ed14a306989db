#!/usr/bin/env bash
# Adaptive k at real size: plain decode against k = auto (and k = 3) on the
# random Llama-3-8B-shaped target with its EAGLE-3 head and the
# DeepSeek-V2-Lite-shaped target with its MTP layer, at synthetic acceptance
# (random weights accept nothing): a good chain head (the figures real models
# show), and a poor one where drafting cannot pay (auto should fall back to
# about plain). Batch 1, 8 and 32. OUT gets auto.json (every run) and
# summary.txt.
# usage: bench/gpu/auto_run.sh BIN_DIR OUT COMMIT
#   ONLY=REGEX: only the runs whose label matches (e.g. 'plain|poor')
#   WARMUP=N: tokens a request of the warm-up round before each batch size
#     (default 64): adaptive k learns once per engine (its acceptance and
#     cost estimates outlive requests), so the measured round is what a
#     running server sees; WARMUP=8 (sessions 5-7) leaves the learning in
#     the measured window of a fresh engine
set -uo pipefail
B=${1:?bin}; OUT=${2:?out}; C=${3:-unknown}
. bench/gpu/env.sh
CKPT=${CKPT:-/dev/shm/specd-ckpt}
mkdir -p "$OUT"
w=$(mktemp -d)
random_ckpt l8b > "$w/ckpt.log"; random_ckpt dsv2lite >> "$w/ckpt.log"
dev=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
run() { # run LABEL ARGS...
    local label=$1; shift
    [[ -n ${ONLY:-} && ! $label =~ $ONLY ]] && return 0
    timeout 150 "$B/bench/specd-bench-decode" --device cuda --commit "$C" --machine "$dev" \
        --max-tokens ${MAXTOK:-128} --prompt-len 64 --warmup ${WARMUP:-64} --batch 1,8,32 --label "$label" \
        --out "$w/run-$label.json" "$@" > "$w/$label.txt" 2> "$w/$label.log" ||
        { echo "== $label: exit $?"; tail -3 "$w/$label.log"; }
    tail -n +2 "$w/$label.txt" | awk -v l="$label" '{printf "%-22s %4s %10s %6s\n", l, $1, $6, $10}'
}
E=(--spec eagle3 --draft-model "$CKPT/l8b-eagle3")
run l8b-plain --model "$CKPT/l8b"
run l8b-eagle3-auto --model "$CKPT/l8b" "${E[@]}" --k auto --synthetic-accept 0.85,0.75,0.6,0.5
run l8b-eagle3-k3 --model "$CKPT/l8b" "${E[@]}" --k 3 --synthetic-accept 0.85,0.75,0.6
run l8b-eagle3-auto-poor --model "$CKPT/l8b" "${E[@]}" --k auto --synthetic-accept 0.15
run dsv2lite-plain --model "$CKPT/dsv2lite"
run dsv2lite-mtp-auto --model "$CKPT/dsv2lite" --spec mtp --k auto --synthetic-accept 0.875,0.6,0.5,0.4
run dsv2lite-mtp-auto-poor --model "$CKPT/dsv2lite" --spec mtp --k auto --synthetic-accept 0.15
python3 - "$w" "$C" "$dev" > "$OUT/auto.json" <<'PY'
import glob, json, os, sys
w, c, dev = sys.argv[1:4]
runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(w, "run-*.json")))]
plain = {(r["label"].split("-")[0], x["batch"]): x["decode_tokens_per_s"]
         for r in runs if r["label"].endswith("-plain") for x in r["results"]}
rows = []
for r in runs:
    m = r["label"].split("-")[0]
    for x in r["results"]:
        p = plain.get((m, x["batch"]))
        rows.append({"label": r["label"], "batch": x["batch"], "tokens_per_s": x["decode_tokens_per_s"],
                     "over_plain": x["decode_tokens_per_s"] / p if p else None,
                     "mean_accepted_length": x["mean_accepted_length"],
                     "draft_ms_per_step": x["draft_ms_per_step"], "verify_ms_per_step": x["verify_ms_per_step"]})
print(json.dumps({"benchmark": "bench/gpu/auto_run.sh", "commit": c, "device": dev, "summary": rows,
                  "runs": runs}, indent=1))
PY
python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
for r in d['summary']: print(f\"{r['label']:24} {r['batch']:3} {r['tokens_per_s']:9.1f} {r['over_plain'] or 0:6.3f} {r['mean_accepted_length']:5.2f}\")" "$OUT/auto.json" | tee "$OUT/summary.txt"
