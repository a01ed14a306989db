#!/usr/bin/env bash
# session 59's one GPU call: the floors first on an H200 (the issue's figure),
# else on an H100 after the validation; the validation of c64179d's build (the
# GPU code of HEAD)
set -uo pipefail
OUT=${1:?OUT}
C=c64179d
t0=$(date +%s)
bash bench/gpu/unpack.sh .carry/base-bin.txz .carry
nvidia-smi -L
if nvidia-smi -L | grep -q H200; then
    BUDGET_S=120 timeout 330 bash bench/gpu/floor_call.sh "$OUT/floor" $C .carry/base-bin
    echo "floor done at $(( $(date +%s) - t0 )) s"
fi
timeout 170 bash tests/gpu/validate.sh .carry/base-bin "$OUT/validate" $C 2>&1 | tail -8
echo "validate done at $(( $(date +%s) - t0 )) s"
if ! nvidia-smi -L | grep -q H200; then
    BUDGET_S=100 timeout 300 bash bench/gpu/floor_call.sh "$OUT/floor" $C .carry/base-bin
    echo "floor done at $(( $(date +%s) - t0 )) s"
fi
