#!/usr/bin/env bash
# Where a decode step's time goes inside its CUDA graph: a CUPTI kernel trace
# (SPECD_KERNEL_TRACE, kernels/cuda/trace.cu) of batch-1 plain decode on the
# random Llama-3-8B-shaped and DeepSeek-V2-Lite-shaped checkpoints, summed up
# by tools/kernel_trace.py: per graph replay the span, the time kernels run
# and the gaps between them, and the kernels by time. OUT gets
# kernel-trace-MODEL.json and the raw traces (traces.tgz).
# usage: bench/gpu/kernel_trace.sh BIN_DIR OUT [BATCH]
set -uo pipefail
B=${1:?bin}; OUT=${2:?out}; BATCH=${3:-1}
. bench/gpu/env.sh
CKPT=${CKPT:-/dev/shm/specd-ckpt}
mkdir -p "$OUT"
w=$(mktemp -d)
for m in l8b dsv2lite; do
    random_ckpt $m > "$w/ckpt-$m.log"
    SPECD_KERNEL_TRACE="$w/kt-$m.txt" timeout 150 "$B/bench/specd-bench-decode" --device cuda \
        --model "$CKPT/$m" --batch "$BATCH" --max-tokens 64 --prompt-len 64 --warmup 8 \
        --opt log-level=info > "$w/$m.txt" 2> "$w/$m.log" || { echo "$m: exit $?"; tail -3 "$w/$m.log"; }
    grep -i "kernel trace" "$w/$m.log"
    tail -1 "$w/$m.txt"
    python3 tools/kernel_trace.py "$w/kt-$m.txt" --graphs 1 --kernels 30 \
        --json "$OUT/kernel-trace-$m.json"
done
tar -C "$w" -czf "$OUT/traces.tgz" .
