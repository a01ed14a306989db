#!/usr/bin/env bash
# CUDA graphs on a GPU: greedy output with graphs equals output without
# (plain and every proposer, the bundled model), then the bundled model's
# tokens/s with and without graphs at batch 1, 8 and 32 (specd-bench-accept).
# usage: bench/gpu/graphs_check.sh BIN_DIR OUT_DIR [COMMIT]
#   BIN_DIR holds specd and specd-bench-accept (a -Dcuda=enabled build)
set -uo pipefail
B=${1:?bin dir}; OUT=${2:?out dir}; COMMIT=${3:-unknown}
mkdir -p "$OUT"
dev=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
heads=(none "" mtp "" eagle3 models/specd-tiny-eagle3 draft models/specd-tiny-draft ngram "")
same=0; diff=0
for ((i = 0; i < ${#heads[@]}; i += 2)); do
    spec=${heads[i]}; dm=${heads[i+1]}
    for p in 'def fibonacci(n):' 'import numpy as np' 'The quick brown fox'; do
        for g in 0 64; do
            "$B/specd" generate --device cuda --spec "$spec" ${dm:+--draft-model $dm} \
                --cuda-graph-max-bs $g --prompt "$p" --max-tokens 96 > "$OUT/gen_${spec}_$g.txt" \
                2> "$OUT/gen_${spec}_$g.err"
        done
        if cmp -s "$OUT/gen_${spec}_0.txt" "$OUT/gen_${spec}_64.txt" && [ -s "$OUT/gen_${spec}_0.txt" ]; then
            same=$((same + 1))
        else
            diff=$((diff + 1)); echo "DIFFER: $spec '$p'"; tail -3 "$OUT/gen_${spec}_64.err"
        fi
    done
done
echo "generate, graphs vs eager: $same equal, $diff differ"
grep -h "cuda graphs" "$OUT"/gen_*_64.err | head -3
common=(--device cuda --eagle3 models/specd-tiny-eagle3 --draft models/specd-tiny-draft
        --temperatures 0 --commit "$COMMIT" --machine "$dev" --ks auto)
for bs in 1 8 32; do
    for g in 0 64; do
        "$B/specd-bench-accept" "${common[@]}" --proposers none,mtp,eagle3,draft,ngram \
            --batch $bs --n-prompts $((bs * 2 > 16 ? bs * 2 : 16)) --max-tokens 128 \
            --cuda-graph-max-bs $g --out "$OUT/accept-b$bs-g$g.json" > "$OUT/accept-b$bs-g$g.txt" \
            2> "$OUT/accept-b$bs-g$g.log"
        echo "== batch $bs, cuda-graph-max-bs $g"; tail -8 "$OUT/accept-b$bs-g$g.txt"
    done
done
