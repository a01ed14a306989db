#!/usr/bin/env bash
# One call on one GPU for what was written without one: the GPU validation
# (every op against the CPU, including the opt-in tensor-core MLA decode and
# MoE prefill paths), seeded sampled output cuda vs cpu per proposer (sampled
# drafts on the device), the tensor-core kernels timed against the default ones,
# then where a real-size decode step's time goes (--profile-ops on the
# Llama-3-8B-shaped and DeepSeek-V2-Lite-shaped models). Everything lands in
# OUT/all.tgz; a short table on stdout.
# usage: bench/gpu/next_1gpu.sh BIN_DIR OUT COMMIT
#   BIN_DIR: specd, test_gpu_ops, test_gpu_model, bench/specd-bench-kernels
set -uo pipefail
B=${1:?bin}; OUT=${2:?out}; C=${3:-unknown}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 SD_SRCDIR=$PWD
w=$(mktemp -d)
# keep what ran so far in OUT after every phase: a call cut short still returns it
save() { tar -C "$w" -czf "$OUT/all.tgz" . 2>/dev/null; }
t0=$(date +%s)
timeout ${VALIDATE_S:-120} bash tests/gpu/validate.sh "$B" "$w/validate" "$C" 2>&1 |
    grep -E "tc|FAIL|passed" | tail -30
echo "validate: $(( $(date +%s) - t0 )) s"; save
# sampled drafts now stay on the device (MTP, draft LM): seeded sampled output
# on cuda vs cpu, equal unless a uniform lands within rounding of a boundary
for spec in mtp draft eagle3; do
    d=()
    [ $spec = draft ] && d=(--draft-model models/specd-tiny-draft)
    [ $spec = eagle3 ] && d=(--draft-model models/specd-tiny-eagle3)
    for dev in cpu cuda; do
        "$B/specd" generate --device $dev --spec $spec --spec-k 3 "${d[@]}" --temperature 0.8 --seed 7 \
            --prompt 'def quicksort(xs):' --max-tokens 64 > "$w/samp_${spec}_$dev.txt" 2>/dev/null
    done
    cmp -s "$w/samp_${spec}_cpu.txt" "$w/samp_${spec}_cuda.txt" && echo "sampled $spec: cuda == cpu" ||
        echo "sampled $spec: cuda != cpu"
done
save
t1=$(date +%s)
timeout ${KERNELS_S:-150} "$B/bench/specd-bench-kernels" --mla --commit "$C" \
    --out "$w/mla-tc.json" > "$w/mla-tc.txt" 2>&1
echo "mla bench: rc $? in $(( $(date +%s) - t1 )) s"; tail -25 "$w/mla-tc.txt"; save
t1=$(date +%s)
timeout ${KERNELS_S:-150} "$B/bench/specd-bench-kernels" --moe-prefill --commit "$C" \
    --out "$w/moe-prefill-tc.json" > "$w/moe-tc.txt" 2>&1
echo "moe bench: rc $? in $(( $(date +%s) - t1 )) s"; tail -25 "$w/moe-tc.txt"; save
t1=$(date +%s)
timeout ${PROFILE_S:-200} bash bench/gpu/profile_ops.sh "$B/specd" "$w/profile" > "$w/profile.txt" 2>&1
echo "profile_ops: rc $? in $(( $(date +%s) - t1 )) s"; head -60 "$w/profile.txt"
save
