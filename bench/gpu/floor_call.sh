#!/usr/bin/env bash
# One short GPU call for the batch-1 floors and the FP8 dot experiment, in
# the order that matters when time runs out:
#   1. bench/gpu/decode_run.sh's ckpt,bw,floor phases on BIN (both random
#      checkpoints, the copy bandwidth, plain decode at batch 1 and 32):
#      OUT/decode/decode.json;
#   2. with F8DOT_BIN (a build with -Dcuda_args=-DSD_F8_DOT=2): the GEMV
#      lab's rows of BIN and of it (bench/gpu/f8dot_call.sh LAB_ONLY=1):
#      OUT/lab-base.json, OUT/lab-f8dot.json.
# usage: bench/gpu/floor_call.sh OUT COMMIT BIN [F8DOT_BIN]
#   BUDGET_S (300): the decode runs' seconds
set -uo pipefail
out=${1:?OUT}; commit=${2:?COMMIT}; bin=${3:?BIN}; f8=${4:-}
mkdir -p "$out"
t0=$(date +%s)
BUDGET_S=${BUDGET_S:-300} bash bench/gpu/decode_run.sh "$bin" "$out/decode" "$commit" ckpt,bw,floor 2>&1 |
    grep -E "copy bandwidth|^(l8b|dsv2lite)|frac|floor" | tail -12
echo "decode: $(($(date +%s) - t0)) s"
[ -n "$f8" ] && LAB_ONLY=1 bash bench/gpu/f8dot_call.sh "$out" "$commit" "$bin" "$f8"
echo "total $(($(date +%s) - t0)) s"
