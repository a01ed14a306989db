#!/usr/bin/env bash
# Where a decode step's time goes at real size: writes the random
# Llama-3-8B-shaped and DeepSeek-V2-Lite-shaped checkpoints (tools/random_ckpt)
# and runs `specd generate --profile-ops` on each (batch 1, 32 tokens after
# an 8-token prompt); the op tables land in OUT.
# usage: bench/gpu/profile_ops.sh SPECD OUT
set -uo pipefail
S=${1:?specd}; OUT=${2:?out}
CK=${CKPT:-/dev/shm/specd-prof}
mkdir -p "$OUT" "$CK"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 tools/random_ckpt/llama.py --preset llama3-8b --out "$CK/l8b" > "$OUT/ckpt.log" 2>&1
"$S" generate --model "$CK/l8b" --ids 1,2,3,4,5,6,7,8 --max-tokens 32 --max-context 512 \
    --profile-ops > /dev/null 2> "$OUT/l8b.txt"
grep -A22 '^op time' "$OUT/l8b.txt"
rm -rf "$CK/l8b"
python3 tools/random_ckpt/deepseek.py --preset v2-lite --out "$CK/dsv2lite" >> "$OUT/ckpt.log" 2>&1
"$S" generate --model "$CK/dsv2lite" --ids 1,2,3,4,5,6,7,8 --max-tokens 32 --max-context 512 \
    --profile-ops > /dev/null 2> "$OUT/dsv2lite.txt"
grep -A26 '^op time' "$OUT/dsv2lite.txt"
