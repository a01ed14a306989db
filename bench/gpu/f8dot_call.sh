#!/usr/bin/env bash
# One GPU call for the FP8 dot experiment (gemv.cuh's SD_F8_DOT): the GEMV
# lab's FP8 rows of a default build and of one built with
# -Dcuda_args=-DSD_F8_DOT=N, then decode_run.sh's fp8 phase (BF16 and FP8
# checkpoints of the 8B and V2-Lite shapes, batch 1 and 32) on each, base
# first, within BUDGET_S (default 500) seconds.
# Build here first (both packed with bench/gpu/pack.sh):
#   meson setup .carry/build-f8dot -Dcuda=enabled -Dgencode=arch=compute_90a,code=sm_90a \
#       --buildtype=release -Dstatic_deps=true -Dcuda_args=-DSD_F8_DOT=2
# usage: bench/gpu/f8dot_call.sh OUT COMMIT BASE_BIN F8DOT_BIN   (LAB_ONLY=1: the lab alone)
set -uo pipefail
out=${1:?OUT}; commit=${2:?COMMIT}; base=${3:?BASE_BIN}; f8=${4:?F8DOT_BIN}
mkdir -p "$out"
t0=$(date +%s)
# lab OUT COMMIT BASE_BIN F8DOT_BIN: the GEMV lab of both builds (OUT/lab-base.json,
# OUT/lab-f8dot.json), their FP8 rows printed
lab() {
    local b d
    for b in base f8dot; do
        d=$3
        [ $b = f8dot ] && d=$4
        timeout 60 "$d/bench/specd-bench-kernels" --gemv-lab --quick --out "$1/lab-$b.json" \
            --commit "$2-$b" > "$1/lab-$b.txt" 2>&1
        echo "lab $b: rc $?"
        grep -E " fp8" "$1/lab-$b.txt"
    done
}
lab "$out" "$commit" "$base" "$f8"
[ -n "${LAB_ONLY:-}" ] && exit 0
for b in base f8dot; do
    bin=$base
    [ $b = f8dot ] && bin=$f8
    left=$(( ${BUDGET_S:-500} - ($(date +%s) - t0) ))
    [ "$left" -gt 150 ] || break
    BUDGET_S=$(( left / 2 > 150 ? left / 2 : 150 )) NOGRAPHS=0 \
        bash bench/gpu/decode_run.sh "$bin" "$out/decode-$b" "$commit-$b" fp8 2>&1 |
        grep -E "^(l8b|dsv2lite)" | tail -8
done
echo "total $(($(date +%s) - t0)) s"
