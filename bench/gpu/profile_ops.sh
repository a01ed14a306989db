#!/usr/bin/env bash
# Where a decode step's time goes at real size: runs `specd generate
# --profile-ops` (batch 1, 32 tokens after an 8-token prompt) on the random
# Llama-3-8B-shaped and DeepSeek-V2-Lite-shaped checkpoints (tools/random_ckpt);
# the op tables land in OUT. A checkpoint already in CKPT (random_ckpt in
# env.sh, the same command) is used as it is; one this
# script writes is removed afterwards.
# usage: bench/gpu/profile_ops.sh SPECD OUT
set -uo pipefail
S=${1:?specd}; OUT=${2:?out}
CK=${CKPT:-/dev/shm/specd-prof}
mkdir -p "$OUT" "$CK"
. bench/gpu/env.sh
prof() { # prof NAME LINES
    local name=$1 lines=$2 own=0
    [ -f "$CK/$name/.complete" ] || own=1
    CKPT=$CK random_ckpt "$name" >> "$OUT/ckpt.log" || return
    "$S" generate --model "$CK/$name" --ids 1,2,3,4,5,6,7,8 --max-tokens 32 --max-context 512 \
        --profile-ops > /dev/null 2> "$OUT/$name.txt"
    grep -A"$lines" '^op time' "$OUT/$name.txt"
    [ $own = 1 ] && rm -rf "${CK:?}/$name" "${CK:?}/$name-eagle3"
}
prof l8b 22
prof dsv2lite 26
