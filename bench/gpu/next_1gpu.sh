#!/usr/bin/env bash
# One call on one GPU, in the order that matters when time runs out:
#   1. the GPU validation of BIN (tests/gpu/validate.sh: every op against the
#      CPU, whole models, graph replay);
#   2. seeded sampled output cuda vs cpu per proposer (fixed k: adaptive k
#      follows measured times, and the tokens a seed gives depend on k);
#   3. with BASE_BIN (another build, e.g. main when BIN has a kernel change):
#      plain decode A/B of the two on both real-size models
#      (bench/gpu/ab_launch.sh, interleaved rounds; AB_EXTRA adds
#      configurations such as new-nopersist=BIN:SPECD_GEMV_PERSIST=0);
#   4. bench/gpu/decode_run.sh (all phases: real-size plain and speculative,
#      the bundled model's adaptive k at batch 1/8/32);
#   5. where a decode step's time goes (--profile-ops on both models);
#   6. KERNELS=1: the MLA and MoE kernel benches (specd-bench-kernels).
# Everything lands in OUT (all.tgz after every phase, decode/ for phase 4);
# a short table on stdout. SKIP_DECODE=1 / SKIP_PROFILE=1 leave out phases
# 4 / 5 (a call is 10 minutes at most: with several A/B configurations,
# run those in a second call); AB_S, DECODE_S, PROFILE_S: their time limits.
# usage: bench/gpu/next_1gpu.sh BIN_DIR OUT COMMIT [BASE_BIN_DIR]
set -uo pipefail
B=${1:?bin}; OUT=${2:?out}; C=${3:-unknown}; BASE=${4:-}
. bench/gpu/env.sh
export CKPT=${CKPT:-/dev/shm/specd-ckpt}
w=$(mktemp -d)
# keep what ran so far in OUT after every phase: a call cut short still returns it
save() { tar -C "$w" -czf "$OUT/all.tgz" . 2>/dev/null; }
t0=$(date +%s)
timeout ${VALIDATE_S:-120} bash tests/gpu/validate.sh "$B" "$w/validate" "$C" 2>&1 |
    grep -E "FAIL|passed" | tail -8
echo "validate: $(( $(date +%s) - t0 )) s"; save
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
if [ -n "$BASE" ]; then
    t1=$(date +%s)
    # AB_EXTRA: more LABEL=BIN[:VAR=VALUE] configurations (e.g. the new
    # build with one of its switches off) in the same interleaved rounds
    timeout ${AB_S:-200} bash bench/gpu/ab_launch.sh "$w/ab" "$C" new="$B" base="$BASE" ${AB_EXTRA:-} 2>&1 | tail -24
    echo "a/b: $(( $(date +%s) - t1 )) s"; save
fi
if [ "${SKIP_DECODE:-0}" != 1 ]; then
    t1=$(date +%s)
    mkdir -p "$OUT/decode"
    timeout ${DECODE_S:-300} bash bench/gpu/decode_run.sh "$B" "$OUT/decode" "$C" > "$w/decode.txt" 2>&1
    grep -E "plain|auto|k1 |k2 |k3 " "$OUT/decode/summary.txt" 2>/dev/null | head -40
    echo "decode: $(( $(date +%s) - t1 )) s"; save
fi
if [ "${SKIP_PROFILE:-0}" != 1 ]; then
    t1=$(date +%s)
    timeout ${PROFILE_S:-120} bash bench/gpu/profile_ops.sh "$B/specd" "$w/profile" > "$w/profile.txt" 2>&1
    echo "profile_ops: rc $? in $(( $(date +%s) - t1 )) s"; head -40 "$w/profile.txt"; save
fi
if [ "${KERNELS:-0}" = 1 ]; then
    "$B/bench/specd-bench-kernels" --mla --commit "$C" --out "$w/mla-tc.json" > "$w/mla-tc.txt" 2>&1
    "$B/bench/specd-bench-kernels" --moe-prefill --commit "$C" --out "$w/moe-prefill-tc.json" \
        > "$w/moe-tc.txt" 2>&1
    tail -30 "$w/mla-tc.txt"; save
fi
