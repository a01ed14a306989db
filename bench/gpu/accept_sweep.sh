#!/usr/bin/env bash
# Speculative speedup of the bundled model on a GPU: the acceptance benchmark
# (plain vs each proposer, k = 1..4 and auto, greedy) at batch 1, 8 and 32.
# usage: bench/gpu/accept_sweep.sh BUILD_DIR OUT_DIR [COMMIT]
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; COMMIT=${3:-unknown}
bench="$B/bench/specd-bench-accept"
dev=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
common=(--device cuda --eagle3 models/specd-tiny-eagle3 --draft models/specd-tiny-draft
        --temperatures 0 --commit "$COMMIT" --machine "$dev")
"$bench" "${common[@]}" --batch 1 --n-prompts 32 --max-tokens 128 --ks 1,2,3,4,auto \
    --out "$OUT/accept-gpu-b1.json" 2>"$OUT/accept-gpu-b1.log" | tee "$OUT/accept-gpu-b1.txt"
for bs in 8 32; do
    "$bench" "${common[@]}" --batch $bs --n-prompts $((bs * 4)) --max-tokens 128 --ks 2,4,auto \
        --out "$OUT/accept-gpu-b$bs.json" 2>"$OUT/accept-gpu-b$bs.log" | tee "$OUT/accept-gpu-b$bs.txt"
done
