#!/usr/bin/env bash
# One call for the pending patch: validate the new build, EAGLE-3 at c = 32 (R32 rounds, B32 s: 260), then c = 16 / 64 (not with MIN=1); on an H200 the V2-Lite floor first. Needs .carry from build.sh.
set -uo pipefail
for t in base-bin new-bin; do bash bench/gpu/unpack.sh .carry/$t.txz .carry >/dev/null; done
C=$(cat .carry/commit)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
if [[ $gpu == *H200* ]]; then BUDGET_S=120 bash bench/gpu/floor_call.sh $OUT/floor $C .carry/base-bin; fi
ROUNDS=${R32:-10} PROPOSERS=eagle3 LEVELS="32=500" BUDGET_S=${B32:-260} bash bench/gpu/serve_call.sh $OUT/a $C .carry/base-bin .carry/new-bin 2>&1 | grep -E "validate|TPOT|total|deadline|FAIL"
[ "${MIN:-0}" = 1 ] || SKIP_VALIDATE=1 ROUNDS=2 LEVELS="16=350 64=650" BUDGET_S=170 bash bench/gpu/serve_call.sh $OUT/b $C .carry/base-bin .carry/new-bin 2>&1 | grep -E "TPOT|total|deadline"
