#!/usr/bin/env bash
# One call for the pending patch (0001: the always-on experts' down rows in
# the routed gate/up launch, SPECD_MOE_ALWAYS_DOWN=1, off by default): on
# an H200 the V2-Lite / 8B floors of the base first; the patch's op tests
# with the switch on (moe_router_ffn's beside-vs-two-ops rows are bitwise);
# V2-Lite plain decode at batch 1 and 2 (BATCH=1: batch 1 only, a shorter
# call), switch off against on, ROUNDS
# interleaved; then the whole validation with the switch on. Needs .carry
# from build.sh (base-bin, new-bin, commit). Land the patch (switch on by
# default) only if the validation passes and it measures faster.
set -uo pipefail
for t in base-bin new-bin; do bash bench/gpu/unpack.sh .carry/$t.txz .carry >/dev/null; done
C=$(cat .carry/commit); B=.carry/new-bin
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
if [[ $gpu == *H200* ]]; then BUDGET_S=100 bash bench/gpu/floor_call.sh $OUT/floor $C .carry/base-bin; fi
mkdir -p $OUT/t
SPECD_MOE_ALWAYS_DOWN=1 timeout 100 $B/test_gpu_ops moe > $OUT/t/ops.txt 2>&1; echo "ops rc $?"
grep -E "FAIL" $OUT/t/ops.txt | head -5; tail -1 $OUT/t/ops.txt
ROUNDS=${ROUNDS:-3} BATCH=${BATCH:-1,2} MODELS=dsv2lite bash bench/gpu/ab_launch.sh $OUT/ab $C+0001 \
    off=$B:SPECD_MOE_ALWAYS_DOWN=0 on=$B:SPECD_MOE_ALWAYS_DOWN=1 2>&1 | tail -12
SPECD_MOE_ALWAYS_DOWN=1 timeout 150 bash tests/gpu/validate.sh $B $OUT/validate $C+0001 2>&1 | tail -3
