#!/usr/bin/env bash
# Where a decode step's time goes at real size: runs `specd generate
# --profile-ops` (batch 1, 32 tokens after an 8-token prompt) on the random
# Llama-3-8B-shaped and DeepSeek-V2-Lite-shaped checkpoints (tools/random_ckpt);
# the op tables land in OUT. A checkpoint already in CKPT (decode_run.sh's
# l8b and dsv2lite, with their .complete markers) is used as it is; one this
# script writes is removed afterwards.
# usage: bench/gpu/profile_ops.sh SPECD OUT
set -uo pipefail
S=${1:?specd}; OUT=${2:?out}
CK=${CKPT:-/dev/shm/specd-prof}
mkdir -p "$OUT" "$CK"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
prof() { # prof NAME LINES WRITER ARGS...
    local name=$1 lines=$2 own=0; shift 2
    if [ ! -f "$CK/$name/.complete" ]; then
        python3 "$@" --out "$CK/$name" >> "$OUT/ckpt.log" 2>&1 || { echo "$name: writing failed"; return; }
        own=1
    fi
    "$S" generate --model "$CK/$name" --ids 1,2,3,4,5,6,7,8 --max-tokens 32 --max-context 512 \
        --profile-ops > /dev/null 2> "$OUT/$name.txt"
    grep -A"$lines" '^op time' "$OUT/$name.txt"
    [ $own = 1 ] && rm -rf "${CK:?}/$name"
}
prof l8b 22 tools/random_ckpt/llama.py --preset llama3-8b
prof dsv2lite 26 tools/random_ckpt/deepseek.py --preset v2-lite
