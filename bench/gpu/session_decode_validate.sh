#!/usr/bin/env bash
# One GPU call: the GPU validation (tests/gpu/validate.sh; the 4k-vs-128k
# context test on the GPU is a row of it), seeded sampled output on cuda
# vs cpu, then the decode benchmark (bench/gpu/decode_run.sh). Everything
# lands in OUT/all.tgz.
# usage: bench/gpu/session_decode_validate.sh BIN_DIR OUT COMMIT
#   BIN_DIR: specd, test_gpu_ops, test_gpu_model, tests/test_engine_context,
#            bench/specd-bench-decode (a -Dcuda=enabled build)
set -uo pipefail
B=${1:?bin}; OUT=${2:?out}; C=${3:-unknown}
. bench/gpu/env.sh
w=$(mktemp -d)
t0=$(date +%s)
timeout ${VALIDATE_S:-110} bash tests/gpu/validate.sh "$B" "$w/validate" "$C" 2>&1 | tail -12
echo "validate: $(( $(date +%s) - t0 )) s"
# seeded sampling: the same tokens on cuda and cpu unless a uniform lands
# within rounding of a boundary
for spec in none mtp ngram; do
    for dev in cpu cuda; do
        # a fixed k: adaptive k follows measured times, and sampled tokens depend on k
        kk=(); [ $spec != none ] && kk=(--spec-k 3)
        "$B/specd" generate --device $dev --spec $spec "${kk[@]}" --temperature 0.8 --seed 7 \
            --prompt 'def quicksort(xs):' --max-tokens 64 > "$w/samp_${spec}_$dev.txt" 2>/dev/null
    done
    if cmp -s "$w/samp_${spec}_cpu.txt" "$w/samp_${spec}_cuda.txt"; then echo "sampled $spec: cuda == cpu"
    else echo "sampled $spec: cuda != cpu"; fi
done
t1=$(date +%s)
timeout ${DECODE_S:-420} bash bench/gpu/decode_run.sh "$B" "$w/decode" "$C" > "$w/decode_run.txt" 2>&1
echo "decode_run: rc $? in $(( $(date +%s) - t1 )) s"
tail -40 "$w/decode_run.txt"
cat "$w/decode/summary.txt" 2>/dev/null | head -60
tar -C "$w" -czf "$OUT/all.tgz" . 2>/dev/null
