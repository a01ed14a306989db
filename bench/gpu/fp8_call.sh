#!/usr/bin/env bash
# One GPU call for block-scaled FP8 weights on the GPU, in the order that
# matters when time runs out:
#   1. tests/gpu/validate.sh on BIN (the FP8 op and model tests among the
#      rest): OUT/val.tgz, its gpu-validate.json inside;
#   2. the GEMV lab at batch 1 (specd-bench-kernels --gemv-lab --quick: the
#      one-pass, auto and fp8 paths of the Llama-3-8B and V2-Lite shapes):
#      OUT/gemv-lab.{txt,json};
#   3. decode_run.sh's fp8 phase (random Llama-3-8B- and V2-Lite-shaped
#      checkpoints in BF16 and FP8, plain decode at batch 1 and 32):
#      OUT/decode/ (decode.json, summary.txt, logs), started only while
#      BUDGET_S (default 560) seconds from the start leave room.
# usage: bench/gpu/fp8_call.sh OUT COMMIT BIN_DIR
set -uo pipefail
out=${1:?OUT}; commit=${2:?COMMIT}; bin=${3:?BIN_DIR}
mkdir -p "$out"
t0=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - t0) )); }
timeout 240 bash tests/gpu/validate.sh "$bin" "$out/val" "$commit" > "$out/val.txt" 2>&1
echo "validate: rc $? in $(($(date +%s) - t0)) s"
grep -E "^FAIL|passed" "$out/val.txt" | head -20
grep -h -E "fp8|^FAIL" "$out"/val/*.log 2>/dev/null | head -60
tar -C "$out" -czf "$out/val.tgz" val && rm -rf "$out/val"
timeout 90 "$bin/bench/specd-bench-kernels" --gemv-lab --quick --out "$out/gemv-lab.json" \
    --commit "$commit" > "$out/gemv-lab.txt" 2>&1
echo "gemv lab: rc $? at $(($(date +%s) - t0)) s"
grep -E "llama8b|dsv2lite" "$out/gemv-lab.txt"
b=$(left)
if [ "$b" -gt 120 ]; then
    BUDGET_S=$((b - 60)) NOGRAPHS=0 bash bench/gpu/decode_run.sh "$bin" "$out/decode" "$commit" bw,fp8 2>&1 |
        grep -vE "^\s*$" | tail -40
fi
echo "total $(($(date +%s) - t0)) s"
