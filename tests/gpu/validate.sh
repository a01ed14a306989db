#!/usr/bin/env bash
# GPU validation on a machine with an NVIDIA GPU: the GPU tests (every op
# against the CPU backend, whole models against the CPU backend, graph
# capture) and `specd generate` on cuda vs cpu; prints a table and writes the
# record bench/results/gpu-validate.json is made of.
#
# usage: tests/gpu/validate.sh BIN_DIR OUT_DIR COMMIT
#   BIN_DIR holds specd, test_gpu_ops, test_gpu_model and
#   tests/test_engine_context (a -Dcuda=enabled build); OUT_DIR receives
#   gpu-validate.json and logs.tgz (the logs).
set -uo pipefail
bin=$1
out=$2
commit=$3
mkdir -p "$out"
. bench/gpu/env.sh
device=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
echo "device: $device"
: > "$out/results.jsonl"
: > "$out/runs.txt"
# The test programs; their RESULT lines are the rows. Work follows the real
# context (tests/engine/test_context.c on the GPU: the same decode with
# --max-context 4096 and 131072) where BIN_DIR has it (bench/gpu/pack.sh
# packs it).
progs="test_gpu_ops test_gpu_model"
[ -x "$bin/tests/test_engine_context" ] && progs="$progs tests/test_engine_context"
for p in $progs; do
    t=$(basename "$p")
    start=$(date +%s%N)
    SD_TEST_DEVICE=cuda "$bin/$p" > "$out/$t.stdout" 2> "$out/$t.log"
    rc=$?
    secs=$(awk "BEGIN { print ($(date +%s%N) - $start) / 1e9 }")
    seed=$(grep -m1 -o 'seed [0-9]*' "$out/$t.log" | cut -d' ' -f2)
    echo "$t $rc $secs ${seed:-0}" >> "$out/runs.txt"
    grep '^RESULT ' "$out/$t.stdout" | sed "s/^RESULT {/{\"program\": \"$t\", /" \
        >> "$out/results.jsonl"
    grep -E '^(FAIL|ok|skip) |passed,|^  decode step' "$out/$t.log"
done
# result TEST ERR: a check of the CLI (ERR 0: passed) into results.jsonl
result() {
    echo "{\"program\": \"specd\", \"test\": \"$1\", \"error\": $2, \"bound\": 0, \"passed\": $([ "$2" = 0 ] && echo true || echo false)}" \
        >> "$out/results.jsonl"
}
# The CLI through the engine: greedy text on cuda equals cpu's, plain and MTP.
prompt='def fibonacci(n):'
for spec in none mtp; do
    for dev in cpu cuda; do
        "$bin/specd" generate --device $dev --spec $spec --prompt "$prompt" --max-tokens 64 \
            > "$out/gen_${dev}_$spec.txt" 2> "$out/gen_${dev}_$spec.err"
        echo "specd generate --device $dev --spec $spec: exit $?" >> "$out/runs.txt"
    done
    if cmp -s "$out/gen_cpu_$spec.txt" "$out/gen_cuda_$spec.txt" && [ -s "$out/gen_cpu_$spec.txt" ]; then
        e=0
    else
        e=1
    fi
    result "specd generate --device cuda --spec $spec (64 greedy tokens) equals --device cpu" $e
done
# Adaptive MTP on a random fixture turns speculation off after a few
# drafts: the steps after that replay the target graphs without the
# proposer's hidden states (captured at start). The tokens equal plain
# decoding's.
fx=tests/golden/models/deepseek-v3
for spec in none mtp; do
    "$bin/specd" generate --device cuda --model "$fx" --spec $spec --spec-k auto --ids 1,5,9 \
        --max-tokens 120 --max-context 256 --log-level debug > "$out/off_$spec.txt" 2> "$out/off_$spec.err"
    echo "specd generate --device cuda --model $fx --spec $spec --spec-k auto: exit $?" >> "$out/runs.txt"
done
e=1
if cmp -s "$out/off_none.txt" "$out/off_mtp.txt" && [ -s "$out/off_none.txt" ] &&
    grep -q "also without the proposer's hidden states" "$out/off_mtp.err" &&
    grep -q "speculation off for the" "$out/off_mtp.err"; then
    e=0
fi
result "adaptive MTP on $fx turns speculation off: plain target graphs replayed, 120 greedy tokens equal --spec none" $e
# The decode chain's kernels read every line of their parameters before the
# programmatic-launch wait (SD_PDL_ENTER(params...)): a line first read
# after it is a round trip to memory on the step's critical path
# (tools/sass_params.py; NOTES.md, session 24). Needs the toolkit's
# cuobjdump; the row is left out where there is none.
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
if [ -n "$cuobjdump" ]; then
    "$cuobjdump" -sass "$bin/specd" > "$out/specd.sass" 2>&1
    if python3 tools/sass_params.py "$out/specd.sass" --check \
        --kernel '^_Z11norm_kernel' --kernel '^_Z11gemv_kernel' --kernel '^_Z14mla_dec_kernel' \
        --kernel '^_Z22mla_prep_absorb_kernel' --kernel '^_Z23moe_route_always_kernel' \
        --kernel '^_Z24moe_gate_up_fused_kernel' --kernel '^_Z21moe_down_fused_kernel' \
        --kernel '^_Z12embed_kernel' --kernel '^_Z16copy_rows_kernel' --kernel '^_Z19argmax_split_kernel' \
        --kernel '^_Z15attn_dec_kernel' --kernel '^_Z11rope_kernel' --kernel '^_Z14rope_kv_kernel' \
        > "$out/sass_params.txt" 2>&1; then
        e=0
    else # the kernels at fault, at least 1 (no kernel found, no listing)
        e=$(grep -c "after it\|wait at none" "$out/sass_params.txt")
        [ "$e" -gt 0 ] || e=1
    fi
    rm -f "$out/specd.sass"
    result "the decode kernels read their parameters before the PDL wait (kernels reading a line after it)" $e
fi
python3 - "$out" "$commit" "$device" <<'EOF'
import json, sys, datetime
out, commit, device = sys.argv[1:4]
tests = [json.loads(l) for l in open(f"{out}/results.jsonl") if l.strip()]
runs = {}
for l in open(f"{out}/runs.txt"):
    p = l.split()
    if p[0].startswith("test_"):
        runs[p[0]] = {"exit": int(p[1]), "seconds": round(float(p[2]), 1), "seed": int(p[3])}
passed = sum(t["passed"] for t in tests)
failed = len(tests) - passed
# a test program that failed or crashed without a failed check still fails
failed += sum(1 for r in runs.values() if r["exit"] not in (0,))
rec = {
    "commit": commit,
    "device": device,
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "command": "meson setup build-cuda -Dcuda=enabled && ninja -C build-cuda && "
               "tests/gpu/validate.sh BIN_DIR OUT_DIR COMMIT",
    "programs": runs,
    "tests": tests,
    "passed": passed,
    "failed": failed,
}
json.dump(rec, open(f"{out}/gpu-validate.json", "w"), indent=1)
w = max(len(t["test"]) for t in tests)
print(f"{'test':<{w}}  {'error':>10}  {'bound':>8}  ok")
for t in tests:
    print(f"{t['test']:<{w}}  {t['error']:>10.3g}  {t['bound']:>8.2g}  {'ok' if t['passed'] else 'FAIL'}")
print(f"programs: {runs}")
print(f"passed {passed}, failed {failed}")
EOF
# OUT keeps two files, the record and its logs (a remote run returns only so
# many files, and the record must not be the one left behind)
logs=$(cd "$out" && ls results.jsonl runs.txt test_*.stdout test_*.log gen_*_*.txt gen_*_*.err \
    off_*.txt off_*.err 2>/dev/null)
if [ -n "$logs" ]; then
    (cd "$out" && tar -czf logs.tgz $logs && rm -f $logs)
fi
