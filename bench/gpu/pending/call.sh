#!/usr/bin/env bash
# One call for the always-on experts' L2 prefetch (SPECD_L2_PREFETCH=MB,
# off by default; SPECD_L2_PREFETCH_AT 0: after the qkv matmul, 1: just
# before attention, 2: half at each; SPECD_L2_PREFETCH_LAST=0:
# evict_normal; SPECD_L2_PREFETCH_POST=1: issued after the PDL wait;
# SPECD_L2_PREFETCH_ATTACH=1: issued by the MLA decode kernel's blocks
# before their wait, no kernel of its own). Session 57's first calls (at
# 5161d6b, site 1 then after attention) ran every own-kernel form; this one
# runs the attached forms against the own kernel before attention:
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
timeout 120 $B/test_gpu_ops attn_mla_decode_kernel > $OUT/t/mla.txt 2>&1; echo "mla rc $?"
grep -c "L2 prefetch issued by its blocks.*ok" $OUT/t/mla.txt; grep -E "FAIL" $OUT/t/mla.txt | head -3; tail -1 $OUT/t/mla.txt
timeout 100 $B/test_gpu_model captured > $OUT/t/model.txt 2>&1; echo "model rc $?"
grep -E "prefetch" $OUT/t/model.txt | head -8; tail -1 $OUT/t/model.txt
P=SPECD_L2_PREFETCH
ROUNDS=${ROUNDS:-2} BATCH=${BATCH:-1} MODELS=dsv2lite bash bench/gpu/ab_launch.sh $OUT/ab $C+pf \
    off=$B:$P=0 own1n=$B:$P=23:${P}_AT=1:${P}_LAST=0 \
    att23n=$B:$P=23:${P}_AT=1:${P}_LAST=0:${P}_ATTACH=1 att11n=$B:$P=11.5:${P}_AT=1:${P}_LAST=0:${P}_ATTACH=1 \
    att23l=$B:$P=23:${P}_AT=1:${P}_ATTACH=1 2>&1 | tail -12
