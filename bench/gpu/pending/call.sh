#!/usr/bin/env bash
# One call for the always-on experts' L2 prefetch (SPECD_L2_PREFETCH=MB,
# off by default; SPECD_L2_PREFETCH_AT 0: after the qkv matmul, 1: after
# attention, 2: half at each; SPECD_L2_PREFETCH_LAST=0: evict_normal;
# SPECD_L2_PREFETCH_POST=1: issued after the PDL wait, not before it):
# its op test and the model's bits with it on, then V2-Lite plain decode at
# batch 1 (BATCH) with it off against the settings below, ROUNDS
# interleaved. Needs .carry/pf-bin.txz (bench/gpu/pack.sh of a CUDA release
# build of this checkout) and .carry/commit. On an H200 the floors first.
set -uo pipefail
bash bench/gpu/unpack.sh .carry/pf-bin.txz .carry >/dev/null
C=$(cat .carry/commit); B=.carry/pf-bin
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
if [[ $gpu == *H200* ]]; then BUDGET_S=100 bash bench/gpu/floor_call.sh $OUT/floor $C $B; fi
mkdir -p $OUT/t
timeout 60 $B/test_gpu_ops prefetch > $OUT/t/ops.txt 2>&1; echo "ops rc $?"; tail -1 $OUT/t/ops.txt
timeout 100 $B/test_gpu_model captured > $OUT/t/model.txt 2>&1; echo "model rc $?"
grep -E "prefetch" $OUT/t/model.txt | head -8; tail -1 $OUT/t/model.txt
P=SPECD_L2_PREFETCH
ROUNDS=${ROUNDS:-2} BATCH=${BATCH:-1} MODELS=dsv2lite bash bench/gpu/ab_launch.sh $OUT/ab $C+pf \
    off=$B:$P=0 at0=$B:$P=23 at0n=$B:$P=23:${P}_LAST=0 at1=$B:$P=23:${P}_AT=1 \
    at2=$B:$P=23:${P}_AT=2 at0p=$B:$P=23:${P}_POST=1 at0g=$B:$P=11.5 2>&1 | tail -16
