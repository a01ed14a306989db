#!/usr/bin/env bash
# Where a target step's wall time goes, by shape, on the bundled model:
# the draft LM with --k auto at batch 1, 8 and 32 (two repeats an engine),
# the engine's debug line of each target step (upload, launch, run,
# download; graph or eager and its rows) averaged by rows x requests.
# Made for the padded steps of a batch's tail (9-15 rows of 2-6 requests:
# 0.46-0.60 ms against 0.20-0.35 for exact graph buckets; NOTES.md,
# session 13). SPEC none gives the plain engine's. Writes OUT/split.txt
# and OUT/split.tgz (the log, the JSON).
# usage: bench/gpu/step_split.sh BIN_DIR OUT [SPEC]   (draft, eagle3, mtp, none)
set -uo pipefail
bin=${1:?BIN_DIR}; out=${2:?OUT}; spec=${3:-draft}
mkdir -p "$out"
w=$(mktemp -d)
d=()
[ "$spec" = draft ] && d=(--draft-model models/specd-tiny-draft)
[ "$spec" = eagle3 ] && d=(--draft-model models/specd-tiny-eagle3)
timeout 120 "$bin/bench/specd-bench-decode" --model models/specd-tiny \
    --prompts models/specd-tiny/heldout_prompts.jsonl --batch 1,8,32 --max-tokens 512 --repeat 2 \
    --device "${DEVICE:-cuda}" --spec "$spec" "${d[@]}" $([ "$spec" = none ] || echo --k auto) \
    --opt log-level=debug \
    --out "$w/run.json" > "$w/run.txt" 2> "$w/run.log"
echo "bench exit $?"
# "... target step: T rows of N requests (graph|eager P): upload a, launch b, run c, download d ms, K keys"
# (K: the keys the rows attend to, the attention's work; the mean a row beside each shape)
grep "target step: .* rows of" "$w/run.log" |
    sed -E 's/.*target step: ([0-9]+) rows of ([0-9]+) requests \(([a-z]+) ([0-9]+)\): upload ([0-9.]+), launch ([0-9.]+), run ([0-9.]+), download ([0-9.]+) ms,? ?([0-9]*).*/\1 \2 \3 \4 \5 \6 \7 \8 \9/' |
    awk '{k = sprintf("%4d x %-3d %s %d", $1, $2, $3, $4); up[k] += $5; la[k] += $6; ru[k] += $7; dl[k] += $8;
          ky[k] += ($9 == "" ? 0 : $9 / $1); c[k]++}
         END {for (k in c) printf "%-22s n=%4d upload %.3f launch %.3f run %.3f download %.3f ms, %.0f keys a row\n",
              k, c[k], up[k] / c[k], la[k] / c[k], ru[k] / c[k], dl[k] / c[k], ky[k] / c[k]}' |
    sort -k3,3n -k1,1n | tee "$out/split.txt"
tar -C "$w" -czf "$out/split.tgz" .
